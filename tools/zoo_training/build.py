"""Building the embedded tiny VLMs from scratch: tokenizer, processor and model config.

Both use the real transformers classes of the paper's targets, so the exact code path of
Qwen2.5-VL-7B and LLaVA-1.6-7B is exercised: ``Qwen2_5_VLForConditionalGeneration``
(M-RoPE, window attention vision tower, 2x2 patch merger) and
``LlavaNextForConditionalGeneration`` (CLIP tower, anyres tiling with pinpoints).
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

IMAGE_SIZE = 224

QWEN_SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
LLAVA_SPECIALS = ("<unk>", "<s>", "</s>", "<image>", "<pad>")

QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAVA_CHAT_TEMPLATE = (  # llava-v1.6-vicuna style
    "{% for message in messages %}{% if message['role'] == 'user' %}USER: {% else %}ASSISTANT: {% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<image>\n{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% if message['role'] == 'user' %} {% else %}</s>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)

ARCHS = ("qwen2.5-vl", "llava-next")
MODEL_NAMES = {"qwen2.5-vl": "tiny-qwen2.5-vl", "llava-next": "tiny-llava-next"}


def train_tokenizer(texts: list[str], arch: str, vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts`` with the specials of ``arch``."""
    specials = list(QWEN_SPECIALS if arch == "qwen2.5-vl" else LLAVA_SPECIALS)
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    if arch == "qwen2.5-vl":
        return PreTrainedTokenizerFast(
            tokenizer_object=backend,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            unk_token="<|endoftext|>",
            extra_special_tokens={
                "image_token": "<|image_pad|>",
                "video_token": "<|video_pad|>",
                "vision_bos_token": "<|vision_start|>",
                "vision_eos_token": "<|vision_end|>",
            },
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        extra_special_tokens={"image_token": "<image>"},
    )


def make_processor(arch: str, tokenizer: PreTrainedTokenizerFast) -> Any:
    """The processor of ``arch``: 224 px images (64 image tokens for Qwen; anyres tiles for LLaVA-NeXT)."""
    if arch == "qwen2.5-vl":
        from transformers import Qwen2VLImageProcessorPil

        from recap.zoo.image_processor import QwenVLImageProcessor

        image_processor = Qwen2VLImageProcessorPil(
            min_pixels=IMAGE_SIZE * IMAGE_SIZE,
            max_pixels=IMAGE_SIZE * IMAGE_SIZE,
            patch_size=14,
            merge_size=2,
            temporal_patch_size=2,
        )
        return QwenVLImageProcessor(
            image_processor=image_processor, tokenizer=tokenizer, chat_template=QWEN_CHAT_TEMPLATE
        )
    from transformers import LlavaNextImageProcessorPil, LlavaNextProcessor

    image_processor = LlavaNextImageProcessorPil(
        size={"shortest_edge": 112},
        crop_size={"height": 112, "width": 112},
        image_grid_pinpoints=LLAVA_PINPOINTS,
    )
    return LlavaNextProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=28,
        vision_feature_select_strategy="default",
        chat_template=LLAVA_CHAT_TEMPLATE,
        num_additional_image_tokens=1,
    )


LLAVA_PINPOINTS = [[112, 224], [224, 112], [224, 224]]


def make_model(
    arch: str,
    tokenizer: PreTrainedTokenizerFast,
    vision_hidden: int = 128,
    vision_intermediate: int | None = None,
    attention_bias: bool = False,
    rms_norm_eps: float | None = None,
) -> Any:
    """A randomly initialised model of ``arch`` (about 5M parameters with the default 128-wide
    vision tower; MLP ``vision_intermediate``, default twice the width), sdpa attention.
    ``attention_bias`` gives LLaVA's Llama text model q/k/v/o biases (Qwen2's have q/k/v biases),
    so that a Qwen2.5-VL text model can be copied into it (``tools.zoo_training.distill``), whose
    ``rms_norm_eps`` it then takes over (default: each architecture's own)."""
    vision_intermediate = vision_intermediate or 2 * vision_hidden
    vocab = len(tokenizer)
    ids = tokenizer.convert_tokens_to_ids
    text = dict(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    if rms_norm_eps is not None:
        text["rms_norm_eps"] = rms_norm_eps
    if arch == "qwen2.5-vl":
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

        config = Qwen2_5_VLConfig(
            text_config=dict(
                text,
                bos_token_id=ids("<|endoftext|>"),
                eos_token_id=ids("<|im_end|>"),
                pad_token_id=ids("<|endoftext|>"),
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12]},
            ),
            vision_config=dict(
                depth=4,
                hidden_size=vision_hidden,
                intermediate_size=vision_intermediate,
                num_heads=4,
                out_hidden_size=256,
                fullatt_block_indexes=[1, 3],
                window_size=112,
                patch_size=14,
                spatial_merge_size=2,
                temporal_patch_size=2,
            ),
            image_token_id=ids("<|image_pad|>"),
            video_token_id=ids("<|video_pad|>"),
            vision_start_token_id=ids("<|vision_start|>"),
            vision_end_token_id=ids("<|vision_end|>"),
            tie_word_embeddings=False,
        )
        config._attn_implementation = "sdpa"
        model = Qwen2_5_VLForConditionalGeneration(config)
        eos, pad = ids("<|im_end|>"), ids("<|endoftext|>")
    else:
        from transformers import LlavaNextConfig, LlavaNextForConditionalGeneration

        config = LlavaNextConfig(
            text_config=dict(
                text,
                model_type="llama",
                attention_bias=attention_bias,
                bos_token_id=ids("<s>"),
                eos_token_id=ids("</s>"),
                pad_token_id=ids("<pad>"),
            ),
            vision_config=dict(
                model_type="clip_vision_model",
                hidden_size=vision_hidden,
                intermediate_size=vision_intermediate,
                num_hidden_layers=4,
                num_attention_heads=4,
                image_size=112,
                patch_size=28,
                projection_dim=128,
            ),
            image_token_index=ids("<image>"),
            image_grid_pinpoints=LLAVA_PINPOINTS,
            vision_feature_select_strategy="default",
            vision_feature_layer=-1,
            image_seq_length=16,
            tie_word_embeddings=False,
        )
        config._attn_implementation = "sdpa"
        model = LlavaNextForConditionalGeneration(config)
        eos, pad = ids("</s>"), ids("<pad>")
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.generation_config.do_sample = False
    return model
