"""How the CLI's process ends (rayline.cli.entry): after `main`, as the interpreter would end it,
without its finalization. In a real process: the exit is what is tested."""

import subprocess
import sys
import textwrap


def _entry_with(main_body: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent("""
        import concurrent.futures, threading, time
        import rayline.cli as cli

        kept = []

        def main():
        {body}

        cli.main = main
        cli.entry()
    """).format(body=textwrap.indent(textwrap.dedent(main_body), "    "))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_an_idle_thread_pool_left_alive_does_not_hold_the_exit():
    """MLflow's artifact repository keeps a thread pool (pyfunc save_model downloads through it in
    the register stage); while the repository is not yet garbage-collected its idle workers wait for
    work. Joining them before threading's exit hooks woke them hung `rayline run --no-serve` after
    its last line (2026-12-03, benchmarks/overhead.py's job section): here that hang is a timeout."""
    done = _entry_with("""
        pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="MlflowLocalArtifactRepository")
        pool.submit(print, "downloaded").result()
        kept.append(pool)  # alive, as the repository that owns it was
    """)
    assert (done.returncode, done.stdout, done.stderr) == (0, "downloaded\n", "")


def test_non_daemon_threads_finish_and_the_exit_code_is_mains():
    done = _entry_with("""
        threading.Thread(target=lambda: (time.sleep(0.3), print("finished"))).start()
        raise SystemExit(3)
    """)
    assert (done.returncode, done.stdout) == (3, "finished\n")
