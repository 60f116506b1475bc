"""Export the published contract: openapi/openapi.json from the app, openapi/parley.d.ts from that.

    python -m scripts.export_openapi           # write both (make openapi)
    python -m scripts.export_openapi --check   # exit 1 when either differs from what would be written

The JSON is deterministic (sorted keys, 2-space indent, trailing newline). The TypeScript declarations
come from openapi-typescript, pinned in openapi/package-lock.json and installed by `make openapi-deps`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from app.main import create_app

ROOT = Path(__file__).resolve().parents[1]
OPENAPI_DIR = ROOT / "openapi"
SPEC = OPENAPI_DIR / "openapi.json"
TYPES = OPENAPI_DIR / "parley.d.ts"
OPENAPI_TYPESCRIPT = OPENAPI_DIR / "node_modules" / ".bin" / "openapi-typescript"


def render_spec() -> str:
    spec = create_app().openapi()
    return json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def render_types(spec: Path) -> str:
    """The TypeScript declarations of a spec file, as openapi-typescript writes them."""
    if not OPENAPI_TYPESCRIPT.exists():
        raise SystemExit(f"{OPENAPI_TYPESCRIPT.relative_to(ROOT)} is missing: run `make openapi-deps`")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / TYPES.name
        subprocess.run(
            [str(OPENAPI_TYPESCRIPT), str(spec), "--output", str(out)],
            check=True,
            capture_output=True,
            cwd=OPENAPI_DIR,
        )
        return out.read_text()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when a committed file is stale")
    check = parser.parse_args().check
    spec = render_spec()
    if not check:
        SPEC.write_text(spec)
        TYPES.write_text(render_types(SPEC))
        print(f"wrote {SPEC.relative_to(ROOT)} and {TYPES.relative_to(ROOT)}")
        return 0
    stale = []
    if not SPEC.exists() or SPEC.read_text() != spec:
        stale.append(SPEC)
    else:
        types = render_types(SPEC)
        if not TYPES.exists() or TYPES.read_text() != types:
            stale.append(TYPES)
    for path in stale:
        print(f"{path.relative_to(ROOT)} is stale: run `make openapi` and commit it", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
