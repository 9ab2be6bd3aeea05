"""Freeze the current schema of every record type into ``schemas/frozen/NAME-vN.arrow``.

Run ``python -m schemas.freeze`` after bumping a record's version. A frozen file is never
rewritten: a test checks that each current schema equals its frozen file, so a change to a schema
without a version bump fails, and readers keep decoding every older version from these files.
"""

from __future__ import annotations

from schemas.codec import FROZEN_DIR, REGISTRY


def main() -> None:
    FROZEN_DIR.mkdir(exist_ok=True)
    for rtype in REGISTRY.values():
        path = FROZEN_DIR / f"{rtype.name}-v{rtype.version}.arrow"
        if path.exists():
            print(f"kept   {path}")
            continue
        path.write_bytes(rtype.schema_with_metadata().serialize().to_pybytes())
        print(f"frozen {path}")


if __name__ == "__main__":
    main()
