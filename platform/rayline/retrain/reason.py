"""How the retrain loop tells the run it starts why it runs: one environment variable holding
{"id", "trigger", "detail"} as JSON, which the register stage copies to the new version
(RETRAIN_TAG), so the loop finds its version by id and `rayline models show` says why it exists."""

__all__ = ["RETRAIN_REASON_ENV"]

RETRAIN_REASON_ENV = "RAYLINE_RETRAIN_REASON"
