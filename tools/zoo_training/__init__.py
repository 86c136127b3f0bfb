"""Training, distillation, evaluation and embedding of the models that ship in ``recap.zoo``.

    python -m tools.zoo_training.train --arch qwen2.5-vl --out checkpoints/tiny-qwen2.5-vl ...
    python -m tools.zoo_training.distill --teacher tiny-qwen2.5-vl --out checkpoints/llava-from-qwen ...
    python -m tools.zoo_training.evaluate --model tiny-qwen2.5-vl --samples 25
    python -m tools.zoo_training.embed_model --run checkpoints/tiny-qwen2.5-vl --name tiny-qwen2.5-vl ...

``build`` makes the fresh models, tokenizers and processors that training starts from. The shipped
models and their loader (``recap.zoo``, ``recap.zoo.image_processor``) stay in the library.
"""
