"""Unit tests of app/protocol/: ids, timestamps, events. The published spec and the TypeScript types, checked
against a live server: tests/contract/."""
