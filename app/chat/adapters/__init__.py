"""Translations of Parley's event stream and history into the frontend kits' own protocols: the AI SDK's UI
message stream (ai_sdk) and AG-UI's events (ag_ui). docs/adapters.md says what maps to what."""
