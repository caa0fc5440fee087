"""SFT: demonstrations tokenize exactly like agent-loop trajectories, the loss covers assistant
tokens only, and a few steps lower it."""

import numpy as np
import pytest
from flax import nnx

from sao_jax import config as config_lib
from sao_jax import envs, models, sft, testing, train_lib

TASK = {
  "id": "t0",
  "problem": "49+5",
  "answer": "54",
  "solution_code": "print(49+5)",
  "solution_output": "54\n",
  "task": "arith",
  "difficulty": 1,
}


def test_demo_tokens_match_the_rendered_conversation_and_mask_actions():
  tok = models.load_tokenizer("byte")
  demo = envs.demonstration(TASK, "compact")
  tokens, mask = sft.demo_tokens(tok, demo)
  # Exactly what the agent loop builds: the prompt with the generation prompt, each action ending
  # in <|im_end|>, observations in the tool-response framing (no re-rendered think block).
  assert tok.decode(tokens) == (
    "<|im_start|>system\nUse <py>code</py> to run Python. Answer as \\boxed{x}.<|im_end|>\n"
    "<|im_start|>user\n49+5<|im_end|>\n<|im_start|>assistant\n<py>print(49+5)</py><|im_end|>"
    "\n<|im_start|>user\n<tool_response>\n54\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n\\boxed{54}<|im_end|>"
  )
  assert tokens[:100] == tok.render_chat(demo)[:100]
  text = tok.decode([t for t, m in zip(tokens, mask, strict=True) if m])
  assert text == "<py>print(49+5)</py><|im_end|>\\boxed{54}<|im_end|>"
  assert not mask[0] and sum(mask) == len(tok.encode("<py>print(49+5)</py>\\boxed{54}")) + 2


def test_direct_answer_demos_follow_tool_fraction():
  c = testing.tiny_config("sao", **{"sft.num_demos": 200, "sft.tool_fraction": 0.25})
  demos = train_lib.make_demos(c)
  with_tool = sum(any(m["role"] == "tool" for m in d) for d in demos)
  assert len(demos) == 200 and 30 <= with_tool <= 70
  direct = next(d for d in demos if not any(m["role"] == "tool" for m in d))
  assert [m["role"] for m in direct] == ["system", "user", "assistant"]
  assert direct[-1]["content"].startswith("\\boxed{")


def test_batches_cycle_and_size_rows_to_the_longest_demo():
  tok = models.load_tokenizer("byte")
  demos = [envs.demonstration(dict(TASK, id=f"t{i}"), "compact") for i in range(5)]
  batches = sft.make_demo_batches(tok, demos, batch_size=4, seq_len=256, seed=0)
  b0, b1 = batches(0), batches(1)
  assert b0["tokens"].shape == (4, 160)  # 144 tokens, rounded up to a multiple of 32
  seen = np.concatenate([b0["tokens"], b1["tokens"]])[:5]
  assert len({r.tobytes() for r in seen}) == 1  # five copies of one demonstration
  assert b0["loss_mask"].sum(1).tolist() == [sum(sft.demo_tokens(tok, demos[0])[1])] * 4


@pytest.mark.parametrize("steps", [12])
def test_sft_lowers_the_loss(tmp_path, steps):
  c = config_lib.validate(
    testing.tiny_config("sao", **{"sft.steps": steps, "sft.lr": 3e-3, "sft.batch_size": 8})
  )
  tok = models.load_tokenizer("byte")
  policy = models.Policy(models.config_from(c.model), rngs=nnx.Rngs(0))
  demos = train_lib.make_demos(c)[:64]
  from sao_jax import metrics

  with metrics.MetricWriter(str(tmp_path), tensorboard=False) as w:
    sft.run(c, policy, tok, demos, writer=w, progress=False)
  nll = [r["sft/nll"] for r in metrics.read_jsonl(str(tmp_path / "metrics.jsonl"))]
  assert len(nll) == steps
  assert nll[0] > 5.0  # ~log(272) for a random byte model
  assert np.mean(nll[-3:]) < 0.7 * nll[0]
