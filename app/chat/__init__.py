"""The one use-case layer: sessions, messages, the turn view, idempotency, API keys and limits."""
