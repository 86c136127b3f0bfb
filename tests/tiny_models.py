"""Tiny random-weight models of every supported architecture, built offline from configs,
with real tokenizers and processors (no hub)."""

from __future__ import annotations

import functools

import torch
from devices import DEVICE
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    CLIPImageProcessorPil,
    LlamaConfig,
    LlamaForCausalLM,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextImageProcessorPil,
    LlavaNextProcessor,
    LlavaProcessor,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen2VLProcessor,
    Qwen3Config,
    Qwen3ForCausalLM,
)

WORDS = [f"w{i}" for i in range(200)] + ["the", "a", "is", "of", "red", "blue", "one", "two", "image", "what"]
QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
LLAVA_SPECIALS = ["<unk>", "<s>", "</s>", "<image>", "<pad>"]
QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)
LLAVA_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<image> {% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %} {% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


def _tokenizer(specials: list[str], **kwargs) -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(specials + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=specials[0]))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(specials)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)


class _QwenVLProcessor(Qwen2_5_VLProcessor):
    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template)


class _Qwen2VLProcessor(Qwen2VLProcessor):
    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template)


TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
)


def _finish(model: torch.nn.Module, eos: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model.eval()
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    return model


def _qwen_vl(version: str):
    tok = _tokenizer(QWEN_SPECIALS, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_SPECIALS}
    vocab = len(tok)
    text = dict(
        TEXT,
        vocab_size=vocab,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    )
    special = dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=56 * 56, max_pixels=112 * 112, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    if version == "2.5":
        vision = dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            fullatt_block_indexes=[1],
            window_size=56,
            patch_size=14,
            spatial_merge_size=2,
        )
        config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **special)
        cls, proc_cls = Qwen2_5_VLForConditionalGeneration, _QwenVLProcessor
    else:
        vision = dict(
            depth=2, embed_dim=32, hidden_size=64, mlp_ratio=2, num_heads=2, patch_size=14, spatial_merge_size=2
        )
        config = Qwen2VLConfig(text_config=text, vision_config=vision, **special)
        cls, proc_cls = Qwen2VLForConditionalGeneration, _Qwen2VLProcessor
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = cls(config)
    processor = proc_cls(image_processor=image_processor, tokenizer=tok, chat_template=QWEN_TEMPLATE)
    return _finish(model, ids["<|im_end|>"]), processor


def _llava(next_: bool):
    tok = _tokenizer(
        LLAVA_SPECIALS,
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        extra_special_tokens={"image_token": "<image>"},
    )
    image_id = tok.convert_tokens_to_ids("<image>")
    text = dict(TEXT, vocab_size=len(tok), model_type="llama")
    vision = dict(
        model_type="clip_vision_model",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
        projection_dim=32,
    )
    if next_:
        config = LlavaNextConfig(
            text_config=text,
            vision_config=vision,
            image_token_index=image_id,
            image_grid_pinpoints=[[28, 56], [56, 28], [56, 56]],
            image_seq_length=4,
        )
        image_processor = LlavaNextImageProcessorPil(
            size={"shortest_edge": 28},
            crop_size={"height": 28, "width": 28},
            image_grid_pinpoints=[[28, 56], [56, 28], [56, 56]],
        )
        cls, proc_cls = LlavaNextForConditionalGeneration, LlavaNextProcessor
    else:
        config = LlavaConfig(text_config=text, vision_config=vision, image_token_index=image_id, image_seq_length=4)
        image_processor = CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
        cls, proc_cls = LlavaForConditionalGeneration, LlavaProcessor
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = cls(config)
    processor = proc_cls(
        image_processor=image_processor,
        tokenizer=tok,
        patch_size=14,
        vision_feature_select_strategy="default",
        chat_template=LLAVA_TEMPLATE,
        num_additional_image_tokens=1,
    )
    return _finish(model, tok.convert_tokens_to_ids("</s>")), processor


def _causal(config_cls, model_cls):
    tok = _tokenizer(LLAVA_SPECIALS[:3], eos_token="</s>", unk_token="<unk>", bos_token="<s>")
    config = config_cls(**TEXT, vocab_size=len(tok))
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = model_cls(config)
    return _finish(model, tok.convert_tokens_to_ids("</s>")), tok


BUILDERS = {
    "qwen2_5_vl": lambda: _qwen_vl("2.5"),
    "qwen2_vl": lambda: _qwen_vl("2"),
    "llava": lambda: _llava(False),
    "llava_next": lambda: _llava(True),
    "llama": lambda: _causal(LlamaConfig, LlamaForCausalLM),
    "mistral": lambda: _causal(MistralConfig, MistralForCausalLM),
    "qwen2": lambda: _causal(Qwen2Config, Qwen2ForCausalLM),
    "qwen3": lambda: _causal(Qwen3Config, Qwen3ForCausalLM),
}
VLM = ("qwen2_5_vl", "qwen2_vl", "llava", "llava_next")


@functools.cache
def build(arch: str):
    """(model, processor_or_tokenizer) of a tiny random ``arch`` model, float32, on ``RECAP_TEST_DEVICE``."""
    model, processor = BUILDERS[arch]()
    return model.to(DEVICE), processor


def save_folders(root, archs=("llama", "llava_next")) -> dict:
    """Each tiny ``arch`` model and its processor saved as a model folder under ``root``: {arch: folder}."""
    out = {}
    for arch in archs:
        model, processor = build(arch)
        model.save_pretrained(root / arch)
        processor.save_pretrained(root / arch)
        out[arch] = root / arch
    return out
