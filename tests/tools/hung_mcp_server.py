"""A stdio "MCP server" that never finishes the handshake: it starts a child, prints a line that is not
JSON-RPC (with `garbage`) or nothing, and sleeps. Each start is logged to $HUNG_LOG ("start"/"child" pid).
"""

import os
import subprocess
import sys
import time

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.environ["HUNG_LOG"], "a") as log:
    log.write(f"start {os.getpid()}\nchild {child.pid}\n")
if sys.argv[1:] == ["garbage"]:
    print("this is not JSON-RPC", flush=True)
time.sleep(600)
