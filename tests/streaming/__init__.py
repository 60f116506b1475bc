"""Unit tests of app/streaming/: the broker, drafts and frames, the write-behind. The stream end to end over
a real socket: tests/streams/."""
