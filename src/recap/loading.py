"""Loading a model and its processor by name or path, and building the inputs of a request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from PIL import Image

from .backends.capabilities import check_config, tree_support
from .errors import InputError, UnsupportedModelError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: choose auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def load_model(name_or_path: str, device: str = "auto", dtype: str = "auto") -> tuple[torch.nn.Module, Any]:
    """(model, processor or tokenizer) for an embedded model name (``tiny-qwen2.5-vl``, or
    ``tiny-qwen2.5-vl@7b``: ``recap.zoo.real_size``), a local directory, or a hub id already in the
    local cache. Attention is sdpa (tree masks need it)."""
    from . import zoo
    from .zoo import real_size

    if real_size.split(name_or_path) is not None:  # an embedded model at a real shape, built on the device
        torch_device = resolve_device(device)
        return real_size.load(name_or_path, torch_device, resolve_dtype(dtype, torch_device))
    if name_or_path in zoo.NAMES:
        model, processor = zoo.load(name_or_path)
        torch_device = resolve_device(device)
        return model.to(torch_device, resolve_dtype(dtype, torch_device)), processor

    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    local = Path(name_or_path).expanduser()
    if name_or_path.startswith(("/", ".", "~")) or local.exists():
        if not (local / "config.json").is_file():
            raise InputError(f"{name_or_path} is not a model directory (no config.json there)")
        name_or_path = str(local)
    elif name_or_path.count("/") != 1:
        raise UnsupportedModelError(
            f"{name_or_path!r} is neither an embedded model ({', '.join(zoo.NAMES) or 'none'}), nor a local "
            "directory, nor a hub id (owner/name)."
        )
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    config = AutoConfig.from_pretrained(name_or_path)
    check_config(config)  # refuse what the config alone shows (e.g. recurrent layers) before loading weights
    torch_device = resolve_device(device)
    image_text = config.model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    cls = AutoModelForImageTextToText if image_text else AutoModelForCausalLM
    model = cls.from_pretrained(name_or_path, dtype=resolve_dtype(dtype, torch_device), attn_implementation="sdpa")
    model = model.to(torch_device).eval()
    tree_support(model)
    from .zoo.image_processor import load_processor  # a saved tiny Qwen2.5-VL folder: its image-only processor

    try:
        processor = load_processor(name_or_path)
    except (OSError, ValueError, TypeError):
        processor = AutoTokenizer.from_pretrained(name_or_path)
    return model, processor


def build_inputs(
    processor: Any, prompt: str, image: Image.Image | str | Path | None = None, device: Any = None
) -> dict[str, Any]:
    """The model inputs of one request: the chat template (where the processor has one)
    applied to a user turn holding the image and the prompt, then the processor; its tensors on
    ``device`` (the model's: ``model_device(model)``) where one is given."""
    inputs = _build_inputs(processor, prompt, image)
    if device is None:
        return inputs
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def model_device(model: torch.nn.Module) -> torch.device:
    """Where a model's first parameter lives (where its inputs must be)."""
    return next(model.parameters()).device


def _build_inputs(processor: Any, prompt: str, image: Image.Image | str | Path | None) -> dict[str, Any]:
    if isinstance(image, (str, Path)):
        path = Path(image)
        if not path.is_file():
            raise InputError(f"image file {path} does not exist")
        try:
            image = Image.open(path).convert("RGB")
        except OSError as exc:
            raise InputError(f"cannot read image {path}: {exc}") from exc
    tokenizer = getattr(processor, "tokenizer", processor)
    has_images = hasattr(processor, "image_processor")
    if image is not None and not has_images:
        raise InputError("this model takes no images (no image processor): give it text-only requests")
    content: list[dict[str, str]] = [{"type": "image"}] if image is not None else []
    content.append({"type": "text", "text": prompt})
    template = getattr(processor, "chat_template", None) or getattr(tokenizer, "chat_template", None)
    if template:
        messages = [{"role": "user", "content": content if has_images else prompt}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        text = prompt
    if has_images:
        return (
            dict(processor(images=image, text=text, return_tensors="pt"))
            if image is not None
            else dict(processor(text=text, return_tensors="pt"))
        )
    return dict(tokenizer(text, return_tensors="pt"))


def decode(processor: Any, token_ids: list[int]) -> str:
    tokenizer = getattr(processor, "tokenizer", processor)
    return tokenizer.decode(token_ids, skip_special_tokens=True)


def sampling_arguments(temperature: float | None, top_p: float | None, top_k: int | None) -> dict[str, Any]:
    """generate's sampling arguments from the CLI's options: {} (greedy) when none is given, else
    ``do_sample=True`` and the ones given."""
    given = {k: v for k, v in dict(temperature=temperature, top_p=top_p, top_k=top_k).items() if v is not None}
    return {"do_sample": True, **given} if given else {}
