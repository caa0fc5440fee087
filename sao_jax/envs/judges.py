"""Style judges for the online writing-style simulation: a local feature judge and an LLM client.

Both have `judge(text, *, task, preferred, pool) -> {'r_quality', 'r_style', 'style'}` with binary
rewards, so the environment can switch between them by config.

`LocalStyleJudge` is offline and deterministic. A text becomes a vector of measurable features:
rates of words from small style lexicons, archaic verb endings, Latinate suffixes, long words,
punctuation marks ('!', '~', ';', '--', emoticons), elongated words, capitalised nouns mid-sentence,
sentence length. It is classified by a linear softmax model (features standardized) over the four styles
plus 'plain'. The model is fitted, deterministically at construction, on the first half of each class's reference texts
(`data/style_refs.json`: King James Bible verses from Debian's bible-kjv for 'classical',
hand-written short texts for the others); the second half is held out to measure accuracy
(docs/envs.md). Quality is binary: a length window, no degenerate repetition, mostly dictionary
words (Debian's wamerican list where installed), and on the task's topic.

`LLMStyleJudge` asks an OpenAI-compatible `/v1/chat/completions` endpoint (e.g. SGLang) to grade.

References: SAO paper §3.5 (online learning simulation with switching style preferences).
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import re
import urllib.request
from typing import Any

import numpy as np

STYLES = ("academic", "cute", "chuunibyou", "classical")
PLAIN = "plain"
REFS = pathlib.Path(__file__).resolve().parent / "data" / "style_refs.json"
_LEX = {
  "cute": "aww hehe teehee yay cute cozy fluffy snuggly snuggle snuggliest wittle teeny tiny "
  "little sweet smiley giggly giggle wiggle bunny kitty puppy hug hugs sparkly pretty "
  "happy play friend friends love uwu adorable yummy silly",
  "chuuni": "darkness dark abyss seal sealed eternal forbidden cursed destiny prophecy awaken "
  "awakened realm sovereign demon void oblivion flame crimson fallen mortal mortals fool "
  "fools foolish kukuku fufufu pact legion legions chosen power dragon tremble doom "
  "twilight bloodline shadow shadows rune runes witness obey judgment",
  "classical": "thee thou thy thine ye hath doth unto shalt shall saith lo verily wherefore thereof "
  "therein wherein whereby upon whoso nay yea art hast wilt spake didst lord god "
  "heaven earth thus",
  "academic": "however furthermore moreover therefore thereby consequently nevertheless although "
  "suggests suggest indicate indicates significant significantly analysis study "
  "studies evidence associated factors mechanisms framework examines examine "
  "investigates process processes variables determined principal substantial "
  "considerable respectively",
}
_LEX = {k: frozenset(v.split()) for k, v in _LEX.items()}
_STOP = frozenset(
  [
    "a",
    "an",
    "the",
    "of",
    "and",
    "or",
    "in",
    "on",
    "at",
    "to",
    "for",
    "with",
    "is",
    "was",
    "it",
    "this",
    "that",
    "my",
    "your",
  ]
)
_WORD = re.compile(r"[A-Za-z']+")
_EMOTICON = re.compile(r"<3|:3|:\)|:D|\^\^|~|owo|uwu", re.I)


def _sentences(text: str) -> list[str]:
  return [s for s in re.split(r"(?<=[.!?;:])\s+", text.strip()) if s] or [""]


def features(text: str) -> np.ndarray:
  """Style features of a text, float32[F] (F = 16, see the module docstring)."""
  words = _WORD.findall(text)
  low = [w.lower().strip("'") for w in words]
  n = max(len(words), 1)
  sents = _sentences(text)
  ns = len(sents)
  rate = lambda lex: sum(w in _LEX[lex] for w in low) / n
  mid_caps = sum(w[:1].isupper() for s in sents for w in _WORD.findall(s)[1:] if w != "I")
  return np.array(
    [
      rate("cute"),
      rate("chuuni"),
      rate("classical"),
      rate("academic"),
      sum(bool(re.search(r"\w(eth|est)$", w)) and len(w) > 5 for w in low) / n,
      sum(bool(re.search(r"(tion|sion|ity|ment|ence|ance|ical|ive|ous)$", w)) for w in low) / n,
      sum(len(w) >= 10 for w in words) / n,
      text.count("!") / ns,
      len(_EMOTICON.findall(text)) / ns,
      sum(bool(re.search(r"(\w)\1\1", w)) for w in low) / n,
      (text.count(";") + text.count(":") - len(re.findall(r":3|:\)|:D", text))) / ns,
      (text.count("--") + text.count("—") + text.count("...")) / ns,
      mid_caps / n,
      min(len(words) / ns / 30.0, 2.0),
      sum(w == "and" for w in low) / n,
      sum(s.split(" ", 1)[0] in ("And", "For", "But") for s in sents) / ns,
    ],
    np.float32,
  )


@functools.lru_cache(maxsize=1)
def reference_texts() -> dict[str, list[str]]:
  """The packaged reference texts per class (styles and 'plain')."""
  with open(REFS, encoding="utf-8") as f:
    return json.load(f)


def split_refs(held_out: bool) -> dict[str, list[str]]:
  """First half of each class (fit) or second half (held out)."""
  refs = reference_texts()
  return {k: v[len(v) // 2 :] if held_out else v[: len(v) // 2] for k, v in refs.items()}


@functools.lru_cache(maxsize=1)
def _dictionary() -> frozenset[str] | None:
  for path in ("/usr/share/dict/words", "/usr/share/dict/american-english"):
    if os.path.exists(path):
      with open(path, encoding="utf-8", errors="ignore") as f:
        return frozenset(w.strip().lower() for w in f if w.strip().isalpha())
  return None


def quality(text: str, topic: str | None = None) -> bool:
  """Binary quality: 5-300 words, not repetitive, mostly real words, mentions the topic."""
  words = [w.lower().strip("'") for w in _WORD.findall(text)]
  if not 5 <= len(words) <= 300 or len(set(words)) < 0.4 * len(words):
    return False
  vocab = _dictionary()
  lexicon = frozenset().union(*_LEX.values())
  if vocab is not None:
    real = sum(w in vocab or w in lexicon or w.rstrip("s") in vocab for w in words)
  else:  # no word list installed: letters-with-a-vowel heuristic
    real = sum(bool(re.fullmatch(r"[a-z]*[aeiouy][a-z]*", w)) for w in words)
  if real < 0.8 * len(words):
    return False
  if topic:
    keys = [w[:4] for w in _WORD.findall(topic.lower()) if w not in _STOP and len(w) >= 3]
    return not keys or any(w.startswith(k) for k in keys for w in words)
  return True


def _fit_softmax(
  x: np.ndarray, y: np.ndarray, k: int, *, l2: float = 1e-2, steps: int = 2000, lr: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
  """L2-regularised multinomial logistic regression by full-batch gradient descent.

  Args:
    x: float[N, F] standardized features.
    y: int[N] class ids in [0, k).
    k: number of classes.

  Returns:
    (w float[F, K], b float[K]); deterministic (zero init, fixed steps).
  """
  w, b = np.zeros((x.shape[1], k)), np.zeros(k)
  onehot = np.eye(k)[y]
  weight = 1.0 / np.bincount(y, minlength=k)[y]  # balance classes of unequal size
  weight = (weight / weight.sum())[:, None]
  for _ in range(steps):
    logits = x @ w + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    g = weight * (p - onehot)  # [N, K]
    w -= lr * (x.T @ g + l2 * w)
    b -= lr * g.sum(0)
  return w, b


class LocalStyleJudge:
  """A linear style classifier on `features`, fitted on the packaged reference texts."""

  def __init__(self, refs: dict[str, list[str]] | None = None):
    refs = refs or split_refs(held_out=False)
    self.classes = sorted(refs)
    x = np.stack([features(t) for c in self.classes for t in refs[c]]).astype(np.float64)
    y = np.array([i for i, c in enumerate(self.classes) for _ in refs[c]])
    self.mean, self.std = x.mean(0), x.std(0) + 1e-3
    self.w, self.b = _fit_softmax((x - self.mean) / self.std, y, len(self.classes))

  def scores(self, text: str) -> dict[str, float]:
    """Logit of every class for `text`."""
    logits = ((features(text) - self.mean) / self.std) @ self.w + self.b
    return dict(zip(self.classes, logits.tolist(), strict=True))

  def classify(self, text: str, pool: tuple[str, ...] = STYLES) -> str:
    """The most likely class among `pool` and 'plain'."""
    scores = self.scores(text)
    return max([*pool, PLAIN], key=lambda c: scores[c])

  def judge(
    self, text: str, *, task: dict[str, Any], preferred: str, pool: tuple[str, ...]
  ) -> dict[str, Any]:
    """{'r_quality', 'r_style', 'style'}: both rewards binary.

    The text is classified among all known styles, so a style outside the pool (e.g. classical in
    the first phases) is recognised as such and never counts as the preferred one.
    """
    del pool  # every pool is a subset of STYLES
    style = self.classify(text, STYLES)
    return dict(
      r_quality=float(quality(text, task.get("topic"))),
      r_style=float(style == preferred),
      style=style,
    )


_RUBRIC = (
  "You grade short texts. Styles: academic (formal, scholarly), cute (playful, sweet, childlike, "
  "exclamations and emoticons), chuunibyou (melodramatic dark-fantasy delusions of grandeur), "
  "classical (archaic, King James Bible English), plain (none of these). Reply with JSON only: "
  '{"style": one of [STYLES], "quality": 1 if the text is fluent, coherent and answers the '
  "request, else 0}."
)


class LLMStyleJudge:
  """The same judge interface, graded by an LLM behind an OpenAI-compatible HTTP endpoint.

  Args:
    base_url: server root, e.g. 'http://127.0.0.1:30000' (SGLang); '/v1/chat/completions' is added.
    model: model name sent in the request.
    api_key: optional bearer token.
    timeout_s: HTTP timeout.
  """

  def __init__(
    self, base_url: str, model: str = "default", api_key: str | None = None, timeout_s: float = 60.0
  ):
    if not base_url:
      raise ValueError("env.judge_url: the LLM judge needs the endpoint's base URL")
    self.url = base_url.rstrip("/") + "/v1/chat/completions"
    self.model, self.api_key, self.timeout_s = model, api_key, timeout_s

  def _ask(self, system: str, user: str) -> str:
    body = dict(
      model=self.model,
      temperature=0.0,
      max_tokens=64,
      messages=[dict(role="system", content=system), dict(role="user", content=user)],
    )
    req = urllib.request.Request(
      self.url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    if self.api_key:
      req.add_header("Authorization", f"Bearer {self.api_key}")
    with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
      return json.loads(resp.read())["choices"][0]["message"]["content"]

  def judge(
    self, text: str, *, task: dict[str, Any], preferred: str, pool: tuple[str, ...]
  ) -> dict[str, Any]:
    system = _RUBRIC.replace("[STYLES]", ", ".join([*pool, PLAIN]))
    reply = self._ask(system, f"Request: {task.get('prompt', '')}\n\nText:\n{text}")
    match = re.search(r"\{.*\}", reply, re.DOTALL)
    try:
      verdict = json.loads(match.group(0)) if match else {}
    except json.JSONDecodeError:
      verdict = {}
    style = str(verdict.get("style", PLAIN)).lower()
    return dict(
      r_quality=float(verdict.get("quality", 0) in (1, "1", True)),
      r_style=float(style == preferred),
      style=style,
    )


def main():
  """Prints the local judge's accuracy on the held-out reference texts (docs/envs.md)."""
  judge, held = LocalStyleJudge(), split_refs(held_out=True)
  print(f"{'class':<12}{'texts':>6}{'accuracy':>10}  most common error")
  right = total = 0
  for cls, texts in held.items():
    preds = [judge.classify(t, STYLES) for t in texts]
    wrong = [p for p in preds if p != cls]
    right, total = right + len(texts) - len(wrong), total + len(texts)
    common = max(set(wrong), key=wrong.count) if wrong else "-"
    print(f"{cls:<12}{len(texts):>6}{1 - len(wrong) / len(texts):>10.3f}  {common}")
  print(f"{'all':<12}{total:>6}{right / total:>10.3f}")


if __name__ == "__main__":
  main()
