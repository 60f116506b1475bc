#!/usr/bin/env bash
# Create or refresh the project virtualenv from the hashed dev lock.
# Called by `make setup` (and every target that needs .venv); safe to run by hand.
#
#   PYTHON  interpreter to build the venv with (default: python3.11, else python3)
#   VENV    venv directory                      (default: .venv)
#   LOCK    lock file to install                (default: requirements-dev.lock)
#   STAMP   stamp file to touch on success      (default: $VENV/.installed-<sha16 of LOCK>)
set -euo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
LOCK=${LOCK:-requirements-dev.lock}
if [[ -z ${PYTHON:-} ]]; then
    PYTHON=$(command -v python3.11 || command -v python3 || true)
fi
[[ -n $PYTHON ]] || { echo "ensure-venv: no python3.11 or python3 on PATH" >&2; exit 1; }
[[ -f $LOCK ]] || { echo "ensure-venv: $LOCK not found (run 'make lock')" >&2; exit 1; }
STAMP=${STAMP:-$VENV/.installed-$(sha256sum "$LOCK" | cut -c1-16)}

is_311() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; }

# Serialize concurrent runs (parallel make, two shells): hold a lock on the lock file,
# then skip the work if another run already installed this exact lock meanwhile.
if [[ -z ${ENSURE_VENV_LOCKED:-} ]] && command -v flock >/dev/null; then
    ENSURE_VENV_LOCKED=1 exec flock "$LOCK" "$SELF"
fi
if [[ -f $STAMP ]] && is_311 "$VENV/bin/python"; then
    exit 0
fi

if ! is_311 "$PYTHON"; then
    echo "ensure-venv: $PYTHON is $("$PYTHON" --version 2>&1); Parley needs Python 3.11" \
         "(set PYTHON=/path/to/python3.11)" >&2
    exit 1
fi

# A venv that is missing, half-built or made by another Python is rebuilt from scratch.
if [[ -d $VENV ]] && ! is_311 "$VENV/bin/python"; then
    echo "ensure-venv: $VENV is broken or not Python 3.11; recreating it"
    rm -rf "$VENV"
fi
if [[ ! -d $VENV ]]; then
    echo "ensure-venv: creating $VENV with $("$PYTHON" --version 2>&1) ($PYTHON)"
    "$PYTHON" -m venv "$VENV"
fi

n=$(grep -cE '^[A-Za-z0-9]' "$LOCK")
echo "ensure-venv: installing $n pinned packages from $LOCK (--require-hashes --no-deps)"
# The lock is complete (pip-compile resolved the whole tree), so --no-deps is safe
# and every file pip downloads must match one of the hashes in the lock.
# This machine's pip config adds file:// extra indexes that lack most projects; pip
# warns once per package about each missing folder, so those lines are dropped.
"$VENV/bin/python" -m pip install --quiet --progress-bar off --disable-pip-version-check \
    --require-hashes --no-deps -r "$LOCK" 2>&1 \
    | { grep -v "' is ignored: it is neither a file nor a directory" || true; }

# Remove packages that an older lock installed but this one no longer lists.
extra=$("$VENV/bin/python" - "$LOCK" <<'PY'
import re, sys
from importlib.metadata import distributions
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
locked = {norm(m.group(1)) for line in open(sys.argv[1])
          if (m := re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==", line))}
installed = {norm(d.metadata["Name"]) for d in distributions() if d.metadata["Name"]}
print(" ".join(sorted(installed - locked - {"pip"})))
PY
)
if [[ -n $extra ]]; then
    echo "ensure-venv: removing packages not in $LOCK: $extra"
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip uninstall --quiet --yes $extra
fi

"$VENV/bin/python" -m pip check >/dev/null || { "$VENV/bin/python" -m pip check >&2; exit 1; }

rm -f "$VENV"/.installed-*
touch "$STAMP"
echo "ensure-venv: $VENV is in sync with $LOCK"
