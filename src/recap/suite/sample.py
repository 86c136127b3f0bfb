"""The :class:`Sample` record shared by all families."""

from __future__ import annotations

from dataclasses import dataclass, field

from PIL import Image


@dataclass(frozen=True)
class Sample:
    """One benchmark item: image, user prompt, reference answer and its checkable field."""

    image: Image.Image = field(hash=False)  # compared by content, not hashed
    prompt: str
    reference: str
    family: str
    check: str
    seed: int

    def image_bytes(self) -> bytes:
        """Raw RGB pixel bytes (for hashing / equality in tests)."""
        return self.image.tobytes()
