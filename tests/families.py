"""Every decoder-only and image-text architecture of transformers, built tiny and offline.

Shared by ``tools/model_families.py`` (the survey that writes the table of docs/models.md) and
``tests/test_families.py`` (the parametrised lossless test).
"""

from __future__ import annotations

import dataclasses
import traceback

import numpy as np
import torch
import transformers
from tiny_models import TEXT
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
)

VOCAB = 256
SLIDING_WINDOW = 12  # small, so that requests cross the window

TEXT_SIZES = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    initializer_range=0.2,  # lively enough that positions and masks change the tokens
    rotary_dim=8,  # gptj, codegen: rotary dims within the 16-dim heads
    # mixture of experts
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    moe_num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    # multi-head latent attention
    kv_lora_rank=16,
    q_lora_rank=32,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=16,
)


def _fields(config_cls) -> set[str]:
    names = {f.name for f in dataclasses.fields(config_cls)} if dataclasses.is_dataclass(config_cls) else set()
    return names | set(getattr(config_cls, "attribute_map", {}))


def tiny_text_config(model_type: str, **overrides):
    """The config of ``model_type`` with tiny sizes (only the fields it has)."""
    config_cls = CONFIG_MAPPING[model_type]
    fields = _fields(config_cls)
    default = config_cls()
    kwargs = {k: v for k, v in TEXT_SIZES.items() if k in fields}
    if getattr(default, "sliding_window", None) is not None and "sliding_window" in fields:
        kwargs["sliding_window"] = SLIDING_WINDOW
    layer_types = getattr(default, "layer_types", None)
    settable = not isinstance(getattr(config_cls, "layer_types", None), property)
    if settable and isinstance(layer_types, (list, tuple)) and len(set(layer_types)) > 1:
        kinds = list(dict.fromkeys(layer_types))
        kwargs["layer_types"] = kinds if len(kinds) > 1 else kinds * 2
        kwargs["num_hidden_layers"] = len(kwargs["layer_types"])
    for name, value in (("pad_token_id", 0), ("bos_token_id", 1), ("eos_token_id", 2)):
        if name in fields:
            kwargs[name] = value
    if "kv_lora_rank" in fields:  # multi-head latent attention: keys have every head
        kwargs["num_key_value_heads"] = kwargs.get("num_attention_heads", 4)
    if "is_decoder" in fields:
        kwargs["is_decoder"] = True
    kwargs.update(overrides)
    config = config_cls(**kwargs)
    return config


@dataclasses.dataclass(frozen=True)
class Family:
    model_type: str
    class_name: str
    kind: str  # "text" or "image-text"


def all_families() -> list[Family]:
    """transformers' causal-LM classes (those that are not image-text models) and image-text classes."""
    image_text = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    out = [Family(t, c, "text") for t, c in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()) if t not in image_text]
    out += [Family(t, c, "image-text") for t, c in sorted(image_text.items())]
    return out


def build_text(family: Family):
    config = tiny_text_config(family.model_type)
    cls = getattr(transformers, family.class_name)
    config._attn_implementation = "sdpa" if cls._supports_sdpa else "eager"
    torch.manual_seed(0)
    model = cls(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def reference(model, inputs, n: int, **kwargs) -> list[int]:
    with torch.inference_mode():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=n, **kwargs)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def text_inputs(rng: np.random.Generator) -> dict:
    ids = torch.tensor([rng.integers(3, VOCAB, size=int(rng.integers(3, 30))).tolist()])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


METHODS = ("ar", "pld", "token_recycling", "recap")
SURVEY_LENGTHS = (40, 100, 24)  # new tokens per prompt in the survey (the CI test uses fewer)


# ---------------------------------------------------------------------------------------------
# image-text families: a tiny config and a processor built offline (Pil image processors, a
# word-level tokenizer with the family's special tokens)

TEXT_DICT = dict(TEXT, head_dim=16)
VISION = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=28, patch_size=14
)
CLIP = dict(VISION, model_type="clip_vision_model", projection_dim=32)
SIGLIP = dict(VISION, model_type="siglip_vision_model")
CHAT = (
    "{% for m in messages %}{{ m['role'] }}: {% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}IMAGE {% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %} {% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


def _chat(image_text: str) -> str:
    return CHAT.replace("IMAGE", image_text)


def _vlm_tokenizer(specials: list[str], **kwargs):
    from tiny_models import _tokenizer

    return _tokenizer(
        ["<unk>", "<s>", "</s>", "<pad>", *specials],
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        **kwargs,
    )


def _ids(tok, *tokens: str) -> list[int]:
    return [tok.convert_tokens_to_ids(t) for t in tokens]


def _vipllava():
    from transformers import CLIPImageProcessorPil, LlavaProcessor, VipLlavaConfig, VipLlavaForConditionalGeneration

    tok = _vlm_tokenizer(["<image>"], extra_special_tokens={"image_token": "<image>"})
    (image_id,) = _ids(tok, "<image>")
    config = VipLlavaConfig(
        text_config=dict(TEXT_DICT, model_type="llama", vocab_size=len(tok)),
        vision_config=CLIP,
        image_token_index=image_id,
        vision_feature_layers=[-2, -1],
        image_seq_length=4,
    )
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}),
        tokenizer=tok,
        patch_size=14,
        vision_feature_select_strategy="default",
        chat_template=_chat("<image> "),
        num_additional_image_tokens=1,
    )
    return VipLlavaForConditionalGeneration, config, processor


def _paligemma():
    from transformers import (
        PaliGemmaConfig,
        PaliGemmaForConditionalGeneration,
        PaliGemmaProcessor,
        SiglipImageProcessorPil,
    )

    tok = _vlm_tokenizer(["<image>"], extra_special_tokens={"image_token": "<image>"})
    (image_id,) = _ids(tok, "<image>")
    config = PaliGemmaConfig(
        text_config=dict(TEXT_DICT, model_type="gemma", vocab_size=len(tok) + 1100),
        vision_config=SIGLIP,
        image_token_index=image_id,
        projection_dim=64,
    )
    image_processor = SiglipImageProcessorPil(size={"height": 28, "width": 28})
    image_processor.image_seq_length = 4
    processor = PaliGemmaProcessor(image_processor=image_processor, tokenizer=tok)
    return PaliGemmaForConditionalGeneration, config, processor


def _gemma3():
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessorPil, Gemma3Processor

    specials = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
    tok = _vlm_tokenizer(
        specials,
        extra_special_tokens={"boi_token": specials[0], "eoi_token": specials[1], "image_token": specials[2]},
    )
    boi, eoi, image_id = _ids(tok, *specials)
    config = Gemma3Config(
        text_config=dict(
            TEXT_DICT,
            model_type="gemma3_text",
            vocab_size=len(tok),
            sliding_window=SLIDING_WINDOW,
            layer_types=["sliding_attention", "full_attention"],
        ),
        vision_config=SIGLIP,
        mm_tokens_per_image=4,
        image_token_index=image_id,
        boi_token_index=boi,
        eoi_token_index=eoi,
    )
    processor = Gemma3Processor(
        image_processor=Gemma3ImageProcessorPil(size={"height": 28, "width": 28}),
        tokenizer=tok,
        image_seq_length=4,
        chat_template=_chat("<start_of_image> "),
    )
    return Gemma3ForConditionalGeneration, config, processor


def _qwen3_vl(moe: bool = False):
    from tiny_models import QWEN_SPECIALS, QWEN_TEMPLATE, _tokenizer
    from transformers import (
        Qwen2VLImageProcessorPil,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLMoeConfig,
        Qwen3VLMoeForConditionalGeneration,
        Qwen3VLProcessor,
    )

    class Processor(Qwen3VLProcessor):  # no video processor (it needs torchvision)
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template)

    tok = _tokenizer(QWEN_SPECIALS, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    ids = dict(zip(QWEN_SPECIALS, _ids(tok, *QWEN_SPECIALS)))
    text = dict(
        TEXT_DICT,
        vocab_size=len(tok),
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 3, 3],
            "mrope_interleaved": True,
        },
    )
    if moe:
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1)
    vision = dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=64,
        patch_size=14,
        spatial_merge_size=2,
        num_position_embeddings=64,
        deepstack_visual_indexes=[1],
    )
    config_cls, cls = (
        (Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration)
        if moe
        else (Qwen3VLConfig, Qwen3VLForConditionalGeneration)
    )
    config = config_cls(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=56 * 56, max_pixels=112 * 112, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    return cls, config, Processor(image_processor=image_processor, tokenizer=tok, chat_template=QWEN_TEMPLATE)


def _prebuilt(name: str):
    def build():
        from tiny_models import build as build_tiny

        return build_tiny(name)

    return build


VLM_BUILDERS = {
    "llava": _prebuilt("llava"),
    "llava_next": _prebuilt("llava_next"),
    "qwen2_vl": _prebuilt("qwen2_vl"),
    "qwen2_5_vl": _prebuilt("qwen2_5_vl"),
    "qwen3_vl": _qwen3_vl,
    "qwen3_vl_moe": lambda: _qwen3_vl(moe=True),
    "vipllava": _vipllava,
    "paligemma": _paligemma,
    "gemma3": _gemma3,
}


def build_vlm(model_type: str):
    built = VLM_BUILDERS[model_type]()
    if len(built) == 2:  # tests/tiny_models.py's
        return built
    cls, config, processor = built
    config._attn_implementation = "sdpa" if cls._supports_sdpa else "eager"
    for sub in ("text_config", "vision_config"):
        if getattr(config, sub, None) is not None:
            getattr(config, sub)._attn_implementation = config._attn_implementation
    torch.manual_seed(0)
    model = cls(config).eval()
    eos = processor.tokenizer.eos_token_id
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    return model, processor


def vlm_inputs(processor, rng: np.random.Generator, image: bool) -> dict:
    from PIL import Image
    from tiny_models import WORDS

    words = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 20))).tolist())
    if not image:
        return dict(processor.tokenizer(words, return_tensors="pt"))
    height, width = (int(x) for x in rng.integers(20, 120, size=2))
    picture = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    if processor.chat_template:
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": words}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True)
    else:
        text = words
    inputs = dict(processor(images=picture, text=text, return_tensors="pt"))
    inputs.pop("labels", None)  # PaliGemma's processor adds them; generate would compute a loss
    return inputs


@dataclasses.dataclass(frozen=True)
class Outcome:
    """status: pass | refused (recap's UnsupportedModelError) | not-tried (no tiny model could be
    built, or transformers' own generate fails on it) | mismatch | crash (the last two are bugs)."""

    status: str
    detail: str = ""


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:240]


# generate's sampling and a prefix-dependent processor, compared under the same seed (``check(sampled=True)``)
SAMPLING = dict(do_sample=True, temperature=0.8, top_k=20, top_p=0.95, repetition_penalty=1.1)


def check(family: Family, lengths: tuple[int, ...] = (40, 100), seed: int = 0, sampled: bool = False) -> Outcome:
    """Build a tiny ``family`` model and compare every method with generate on prompts of
    ``lengths`` new tokens, each also with an EOS the greedy text reaches mid-way
    (image-text: with and without an image). ``sampled``: also each drafting method with
    ``SAMPLING`` against ``generate(**SAMPLING)`` under the same ``torch.manual_seed``, on the
    first prompt."""
    import recap
    from recap.backends.hf import check_supported
    from recap.errors import UnsupportedModelError

    try:
        if family.kind == "text":
            model, processor = build_text(family), None
        elif family.model_type in VLM_BUILDERS:
            model, processor = build_vlm(family.model_type)
        else:
            return Outcome("not-tried", "no tiny processor and config written for it yet")
    except Exception as exc:  # noqa: BLE001
        return Outcome("not-tried", f"tiny model not built: {_first_line(exc)}")
    try:
        check_supported(model)
    except UnsupportedModelError as exc:
        return Outcome("refused", str(exc))
    rng = np.random.default_rng(seed)
    cases = []
    for i, n in enumerate(lengths if processor is None else [n for n in lengths for _ in (0, 1)]):
        inputs = text_inputs(rng) if processor is None else vlm_inputs(processor, rng, image=i % 2 == 0)
        try:
            expected = reference(model, inputs, n)
        except Exception as exc:  # noqa: BLE001
            return Outcome("not-tried", f"generate fails on the tiny model: {_first_line(exc)}")
        cases.append((inputs, n, None, expected))
        fresh = [t for j, t in enumerate(expected) if j >= 4 and t not in expected[:j]]
        if fresh:
            cases.append(
                (inputs, n, fresh[0], reference(model, inputs, n, eos_token_id=fresh[0], pad_token_id=fresh[0]))
            )
    for i, (inputs, n, eos, expected) in enumerate(cases):
        for method in METHODS:
            try:
                # (eos_token_id=None would mean "no EOS", as in generate: pass it only when set)
                stop = {} if eos is None else {"eos_token_id": eos}
                got = recap.generate(model, inputs, method=method, max_new_tokens=n, **stop).token_ids
            except UnsupportedModelError as exc:
                return Outcome("refused", str(exc))
            except Exception as exc:  # noqa: BLE001
                tb = traceback.extract_tb(exc.__traceback__)[-1]
                return Outcome("crash", f"{method} case {i}: {_first_line(exc)} at {tb.name}:{tb.lineno}")
            if got != expected:
                return Outcome(
                    "mismatch", f"{method} case {i} (eos {eos}): first differs at token {_first_diff(got, expected)}"
                )
    if sampled:
        inputs, n = cases[0][0], cases[0][1]
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=n, **SAMPLING)
        expected = out[0, inputs["input_ids"].shape[1] :].tolist()
        for method in ("token_recycling", "recap"):
            torch.manual_seed(seed)
            got = recap.generate(model, inputs, method=method, max_new_tokens=n, **SAMPLING).token_ids
            if got != expected:
                return Outcome("mismatch", f"{method} sampled: first differs at token {_first_diff(got, expected)}")
    return Outcome("pass")


def _first_diff(got: list[int], expected: list[int]) -> int:
    return next((j for j, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
