"""Generate Python code for the rollway protos into services/<service>/v1/.

The proto package rollway.<service>.v1 maps to the Python package rollway.<service>.v1, which
is services/<service>/v1/ (pyproject maps `rollway` to services/). protoc writes the mirrored
tree to a temporary directory; this script copies it into place.

It also writes services/common/v1/descriptors.binpb: a FileDescriptorSet of every proto (and its
imports) with source info, so that server reflection (rollway.common.reflection) serves the
.proto comments as documentation.

    python protos/generate.py           # regenerate
    python protos/generate.py --check   # exit 1 if the committed code is stale
"""

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
SERVICES = ["common", "dataloader", "rollout", "trainer", "coordinator"]
# Relative to the generated `rollway` tree; rollway.common.reflection reads it from there.
DESCRIPTOR_SET = Path("common") / "v1" / "descriptors.binpb"


def _generate(out: Path) -> None:
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    well_known = Path(protoc.__file__).parent / "_proto"
    (out / "rollway" / DESCRIPTOR_SET).parent.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        f"--descriptor_set_out={out / 'rollway' / DESCRIPTOR_SET}",
        "--include_imports",
        "--include_source_info",
        *protos,
    ]
    if protoc.main(args) != 0:
        sys.exit("protoc failed")


def _generated_files(base: Path) -> dict[str, Path]:
    files = {
        str(p.relative_to(base)): p
        for service in SERVICES
        for p in (base / service / "v1").glob("*_pb2*.py*")
    }
    if (base / DESCRIPTOR_SET).exists():
        files[str(DESCRIPTOR_SET)] = base / DESCRIPTOR_SET
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check freshness")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        _generate(Path(tmp))
        fresh = _generated_files(Path(tmp) / "rollway")
        committed = _generated_files(ROOT / "services")
        if args.check:
            stale = sorted(
                name
                for name in fresh.keys() | committed.keys()
                if name not in fresh
                or name not in committed
                or not filecmp.cmp(fresh[name], committed[name], shallow=False)
            )
            if stale:
                print("generated proto code is stale (run `make proto`):", *stale, sep="\n  ")
                return 1
            print(f"generated proto code is fresh ({len(fresh)} files)")
            return 0
        for name in committed.keys() - fresh.keys():
            committed[name].unlink()
        for name, src in fresh.items():
            dst = ROOT / "services" / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            (dst.parent / "__init__.py").touch()
            shutil.copyfile(src, dst)
        print(f"generated {len(fresh)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
