"""Whisper transcription of clips of any length, through the public Generator API.

A clip of at most one window (``chunk_size`` s, 30 for Whisper) is decoded as the reference
decodes it: one pass, the caller's prompt (``<|notimestamps|>`` by default), batched with the
other short clips. A longer clip is transcribed window after window as Whisper's own long-form
algorithm does it (onnxruntime-genai 0.18 cuts such audio at 30 s without a word): the decoder
predicts timestamp tokens, each completed ``<|t0|> text <|t1|>`` segment is kept, and the next
window starts at the last completed segment's end, so a word cut by a window's edge is decoded
again whole in the next window: no audio is skipped and no segment is kept twice.

Decoding is greedy with Whisper's timestamp rules (``timestamp_logits``): timestamps come in
pairs and never go back, the first token is a timestamp within the first second, and timestamps
win whenever their total probability beats every single text token; symbols that are never
speech (brackets, music notes...) are suppressed, as Whisper's default decoding does. The next
window starts at the end of the last completed segment. A window whose text repeats
itself (gzip compression ratio over 2.4) is decoded again, sampling at rising temperatures with
a fixed seed; a window the model marks as silence (``<|nocaptions|>`` above 0.6 and a mean
log-probability below -1) adds no text. The previous window's text is not fed back as a prompt:
that keeps a tiny model from carrying a repetition from one window into the next.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..errors import GenerationError, UnsupportedError
from .decode import AudioSource
from .features import FeatureConfig, log_mel
from .stream import ClipReader


class SpeechProcessor(Protocol):
    """What the driver reads of a multimodal processor (``MultiModalProcessor`` is one)."""

    model: Any
    tokenizer: Any
    audio_input: str

    @property
    def audio_config(self) -> FeatureConfig: ...

    def decode(self, ids: Any) -> str: ...


# ``new_generator(**search_options)``: a fresh Generator over the processor's model. Given by
# the caller (Model.transcribe, the server), so this floor needs no import of the generator.
NewGenerator = Callable[..., Any]

NO_TIMESTAMPS = "<|notimestamps|>"
NO_SPEECH = "<|nocaptions|>"
START = "<|startoftranscript|>"
MAX_INITIAL_SECONDS = 1.0
NO_SPEECH_THRESHOLD = 0.6
LOGPROB_THRESHOLD = -1.0
COMPRESSION_LIMIT = 2.4
FALLBACK_TEMPERATURES = (0.2, 0.4, 0.6, 0.8, 1.0)


@dataclass(frozen=True)
class Segment:
    """A span of the transcript; times in seconds from the start of the clip."""

    start: float
    end: float
    seek: int  # the feature frame its window starts at
    text: str
    tokens: tuple[int, ...]
    avg_logprob: float
    no_speech_prob: float
    compression_ratio: float


@dataclass(frozen=True)
class Transcript:
    text: str
    duration: float  # seconds of audio read
    segments: tuple[Segment, ...]


@dataclass(frozen=True)
class TimestampVocab:
    """Where Whisper's timestamp tokens sit: right after ``<|notimestamps|>``, one per
    ``seconds`` from 0 to the window's length, up to the end of the vocabulary."""

    eot: int
    begin: int
    count: int
    seconds: float
    no_speech: int | None

    @classmethod
    def of(cls, tokenizer: Any, vocab_size: int, eot: int, window_seconds: int) -> TimestampVocab:
        marker = tokenizer.to_token_id(NO_TIMESTAMPS)
        if marker < 0 or vocab_size - (marker + 1) < 2:
            raise UnsupportedError(
                f"audio longer than {window_seconds} s needs Whisper's timestamp tokens (after "
                f"{NO_TIMESTAMPS} in the vocabulary); this model has none"
            )
        count = vocab_size - (marker + 1)
        no_speech = tokenizer.to_token_id(NO_SPEECH)
        seconds = window_seconds / (count - 1)
        return cls(eot, marker + 1, count, seconds, no_speech if no_speech >= 0 else None)


def _logsumexp(x: np.ndarray) -> float:
    top = float(x.max())
    if top == -np.inf:
        return -np.inf
    return top + float(np.log(np.exp(x - top).sum()))


def timestamp_logits(
    logits: np.ndarray,
    sampled: Sequence[int],
    vocab: TimestampVocab,
    max_initial: int,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The next token's logits (float64, in ``out`` when given) with what Whisper's timestamp
    rules forbid at -inf.

    ``sampled``: the tokens generated in this window so far; ``max_initial``: the latest
    timestamp (in steps) the first token may be.
    """
    flat = np.asarray(logits).reshape(-1)
    if out is None:
        out = np.empty(flat.size, np.float64)
    out[:] = flat
    begin = vocab.begin
    out[vocab.eot + 1 : begin] = -np.inf  # task and prompt markers are never generated
    if not sampled:
        out[:begin] = -np.inf  # a window opens with a timestamp, within the first second
        out[begin + max_initial + 1 :] = -np.inf
        return out
    last = sampled[-1] >= begin
    before_last = len(sampled) < 2 or sampled[-2] >= begin
    if last:
        if before_last:
            out[begin:] = -np.inf  # a pair closed a segment and opened the next: text follows
        else:
            out[: vocab.eot] = -np.inf  # text then a timestamp: a timestamp (or the end) next
    stamps = [t for t in sampled if t >= begin]
    if stamps:
        # Never back in time; a segment's end lies after its start.
        floor = stamps[-1] if last and not before_last else stamps[-1] + 1
        out[begin:floor] = -np.inf
    # Timestamps together more likely than any single text token: a timestamp it is.
    if _logsumexp(out[begin:]) > out[:begin].max():
        out[:begin] = -np.inf
    return out


@dataclass(frozen=True)
class _Window:
    tokens: list[int]
    logprob: float
    no_speech_prob: float


def split_segments(
    tokens: Sequence[int], vocab: TimestampVocab
) -> tuple[list[tuple[int, int, list[int]]], int | None]:
    """Completed ``(start step, end step, text tokens)`` segments of one window's tokens, and
    the step where the next window starts: the end of the last completed segment (None: no
    segment completed, the next window starts after this one).

    Whisper's own loop skips the rest of the window after a segment that ends the output; a
    small model ends early on speech it finds hard, and the speech after that point was lost
    (20 s of a 2-minute clip). Starting at the segment's end costs a window over silence now and
    then, and loses nothing.
    """
    begin = vocab.begin
    stamp = [t >= begin for t in tokens]
    ends_complete = len(tokens) >= 2 and stamp[-1] and not stamp[-2]
    cuts = [i for i in range(1, len(tokens)) if stamp[i] and stamp[i - 1]]
    if cuts or ends_complete:
        bounds = cuts + ([len(tokens)] if ends_complete else [])
        segments, first = [], 0
        for cut in bounds:
            piece = tokens[first:cut]
            text = [t for t in piece if t < begin]
            if text:
                segments.append((piece[0] - begin, piece[-1] - begin, text))
            first = cut
        return segments, tokens[first - 1] - begin
    text = [t for t in tokens if t < begin]
    stamps = [t - begin for t in tokens if t >= begin]
    if not text:
        return [], None
    return [(stamps[0] if stamps else 0, -1, text)], None


# Symbols that are never speech: suppressed in long-form windows, as Whisper's default decoding
# does, so a hard passage is not "transcribed" as [Music] or a run of notes.
NON_SPEECH = (
    *'"#()*+/:;<=>@[\\]^_`{|}~「」『』',
    *("<<", ">>", "<<<", ">>>", "--", "---", "-(", "-[", "('", '("', "((", "))", "(((", ")))"),
    *("[[", "]]", "{{", "}}", "♪♪", "♪♪♪"),
)
MUSIC = "♩♪♫♬♭♮♯"


def non_speech_tokens(tokenizer: Any) -> np.ndarray:
    """Ids of the symbols above, alone and after a space, where each is one token (the first
    token of a musical sign), and of " -" and " '" (dashes and quotes starting a word)."""
    ids = {int(tokenizer.encode(" -")[0]), int(tokenizer.encode(" '")[0])}
    for symbol in (*NON_SPEECH, *MUSIC):
        for text in (symbol, " " + symbol):
            tokens = [int(t) for t in tokenizer.encode(text)]
            if len(tokens) == 1 or (tokens and symbol in MUSIC):
                ids.add(tokens[0])
    return np.array(sorted(ids), np.int64)


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / max(1, len(gzip.compress(data)))


class LongFormDecoder:
    """Transcribes one clip window by window on a model's Generator."""

    def __init__(
        self, processor: SpeechProcessor, new_generator: NewGenerator, prompt_ids: Sequence[int]
    ):
        model = processor.model
        self.processor = processor
        self.new_generator = new_generator
        self.config: FeatureConfig = processor.audio_config
        self.max_length = int(model.spec.generation.max_length)
        eos = model.spec.tokens.eos
        eot = int(eos[0]) if eos else processor.tokenizer.to_token_id("<|endoftext|>")
        vocab_size = model.plan.vocab_size
        if vocab_size is None:
            raise UnsupportedError("long-form transcription needs the decoder's vocabulary size")
        self.vocab = TimestampVocab.of(processor.tokenizer, vocab_size, eot, self.config.chunk_size)
        marker = self.vocab.begin - 1
        self.prompt = [int(t) for t in prompt_ids if int(t) != marker]
        if not self.prompt:
            raise GenerationError("long-form transcription needs a decoder prompt")
        start = processor.tokenizer.to_token_id(START)
        # <|nocaptions|> is read where the model predicts it: right after <|startoftranscript|>.
        self._measure_silence = self.vocab.no_speech is not None and self.prompt[-1] == start
        self.sample_len = min(self.max_length - len(self.prompt), self.max_length // 2)
        self.step_frames = max(
            1, round(self.vocab.seconds * self.config.sample_rate / self.config.hop_length)
        )
        self.max_initial = round(MAX_INITIAL_SECONDS / self.vocab.seconds)
        self.suppressed = non_speech_tokens(processor.tokenizer)

    def transcribe(self, clip: ClipReader, stop: Callable[[], bool] | None = None) -> Transcript:
        """The whole clip, from its first window on (``clip`` is read forward from 0)."""
        cfg = self.config
        hop, window = cfg.hop_length, cfg.chunk_size * cfg.sample_rate
        segments: list[Segment] = []
        seek = 0  # in feature frames
        total = None
        samples = 0
        while total is None or seek < total:
            pcm, ends = clip.window(seek * hop, window)
            if ends:
                total = seek + pcm.size // hop
                samples = seek * hop + pcm.size
            content = cfg.frames if not ends else min(cfg.frames, pcm.size // hop)
            if content <= 0:
                break
            decoded = self._decode(log_mel(pcm, cfg), stop)
            found, resume = split_segments(decoded.tokens, self.vocab)
            avg_logprob = decoded.logprob / max(1, len(decoded.tokens))
            silent = (
                decoded.no_speech_prob > NO_SPEECH_THRESHOLD and avg_logprob < LOGPROB_THRESHOLD
            )
            offset = seek * hop / cfg.sample_rate
            limit = content * hop / cfg.sample_rate
            for start, end, text_ids in [] if silent else found:
                text = self.processor.decode(text_ids)
                stop_s = limit if end < 0 else min(limit, end * self.vocab.seconds)
                segments.append(
                    Segment(
                        start=round(offset + start * self.vocab.seconds, 3),
                        end=round(offset + stop_s, 3),
                        seek=seek,
                        text=text,
                        tokens=tuple(text_ids),
                        avg_logprob=avg_logprob,
                        no_speech_prob=decoded.no_speech_prob,
                        compression_ratio=compression_ratio(text),
                    )
                )
            advance = content if resume is None or silent else resume * self.step_frames
            seek += advance if 0 < advance <= content else content
        text = "".join(s.text for s in segments)
        duration = samples / cfg.sample_rate
        return Transcript(text=text, duration=duration, segments=tuple(segments))

    def _decode(self, features: np.ndarray, stop: Callable[[], bool] | None) -> _Window:
        """Greedy; a window whose text repeats itself (gzip ratio over 2.4) is decoded again
        sampling at rising temperatures, as Whisper's long-form decoding does."""
        window = self._decode_at(features, stop, 0.0)
        for temperature in FALLBACK_TEMPERATURES:
            text = self.processor.decode([t for t in window.tokens if t < self.vocab.begin])
            if compression_ratio(text) <= COMPRESSION_LIMIT:
                break
            window = self._decode_at(features, stop, temperature)
        return window

    def _decode_at(
        self, features: np.ndarray, stop: Callable[[], bool] | None, temperature: float
    ) -> _Window:
        generator = self.new_generator(max_length=len(self.prompt) + self.sample_len)
        ids = np.array([self.prompt], np.int32)
        generator.set_inputs({self.processor.audio_input: features[None], "input_ids": ids})
        rng = np.random.default_rng(0)  # the same audio gives the same text
        allowed = np.empty(self.vocab.begin + self.vocab.count, np.float64)
        sampled: list[int] = []
        total = 0.0
        no_speech = 0.0
        while True:
            if stop is not None and stop():
                raise GenerationError("transcription cancelled")
            logits = generator.get_logits()[0, 0]
            if not sampled and self._measure_silence:
                allowed[:] = logits
                no_speech = float(np.exp(allowed[self.vocab.no_speech] - _logsumexp(allowed)))
            timestamp_logits(logits, sampled, self.vocab, self.max_initial, out=allowed)
            allowed[self.suppressed] = -np.inf
            norm = _logsumexp(allowed)
            if norm == -np.inf:
                token = self.vocab.eot
            elif temperature == 0.0:
                token = int(np.argmax(allowed))
            else:
                probs = np.exp((allowed - allowed.max()) / temperature)
                token = int(rng.choice(probs.size, p=probs / probs.sum()))
            total += float(allowed[token] - norm)
            if token == self.vocab.eot or len(sampled) + 1 >= self.sample_len:
                if token != self.vocab.eot:
                    sampled.append(token)
                break
            sampled.append(token)
            generator.append_tokens([[token]])
        return _Window(sampled, total, no_speech)


def transcribe_clips(
    processor: SpeechProcessor,
    new_generator: NewGenerator,
    clips: Sequence[tuple[str, AudioSource]],
    prompt: str,
    *,
    timestamps: bool = False,
    stop: Callable[[], bool] | None = None,
    **search_options: Any,
) -> list[Transcript]:
    """Transcripts of ``(name, audio)`` clips. Clips of at most one window go through the
    reference's single pass (one batch, ``search_options`` apply) unless ``timestamps`` asks
    for timed segments; longer clips, and every clip with ``timestamps``, go window by window
    (greedy: search options are refused there rather than ignored)."""
    prompt_ids = [int(t) for t in processor.tokenizer.encode(prompt)]
    cfg = processor.audio_config
    window = cfg.chunk_size * cfg.sample_rate
    results: list[Transcript | None] = [None] * len(clips)
    short: list[tuple[int, np.ndarray, float]] = []
    longform: LongFormDecoder | None = None
    for i, (name, source) in enumerate(clips):
        with ClipReader(source, cfg.sample_rate, name) as clip:
            pcm, ends = clip.window(0, window)
            if pcm.size == 0:
                raise GenerationError(f"{name}: the audio file holds no samples")
            if ends and not timestamps:
                short.append((i, log_mel(pcm, cfg), pcm.size / cfg.sample_rate))
                continue
            if search_options:
                raise UnsupportedError(
                    f"{name}: search options ({', '.join(sorted(search_options))}) apply to "
                    f"clips of at most {cfg.chunk_size} s without timestamps; longer audio is "
                    "transcribed greedily, window by window"
                )
            longform = longform or LongFormDecoder(processor, new_generator, prompt_ids)
            results[i] = longform.transcribe(clip, stop)
    if short:
        features = [f for _, f, _ in short]
        texts = _one_pass(processor, new_generator, prompt_ids, features, search_options)
        for (i, _, seconds), text in zip(short, texts):
            results[i] = Transcript(text=text, duration=seconds, segments=())
    return [r for r in results if r is not None]


def _one_pass(
    processor: SpeechProcessor,
    new_generator: NewGenerator,
    prompt_ids: list[int],
    features: list[np.ndarray],
    search_options: dict[str, Any],
) -> list[str]:
    """The reference's decoding of short clips: one batch, the prompt as given."""
    generator = new_generator(batch_size=len(features), **search_options)
    ids = np.array([prompt_ids] * len(features), np.int32)
    generator.set_inputs({processor.audio_input: np.stack(features), "input_ids": ids})
    while not generator.is_done():
        generator.generate_next_token()
    return [processor.decode(generator.get_sequence(i)) for i in range(len(features))]
