"""The namespace of rayline's entries in Ray's internal KV store (routing tables, gates, replica
acks, monitoring windows): a leaf module, so any module can name it without importing the router."""

__all__ = ["KV_NAMESPACE"]

KV_NAMESPACE = "rayline"
