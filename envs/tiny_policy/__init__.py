"""Build tooling of the offline tiny policy: its synthetic corpus, tokenizer, chat template,
training and evaluation scripts.

`python -m envs.tiny_policy.build --out DIR` trains a checkpoint from scratch;
`python -m envs.tiny_policy.evaluate --model DIR` measures one. The shipped checkpoint lives in
`agentrl/assets/tiny_policy` (`agentrl.tiny_policy.DEFAULT_MODEL_PATH`); the framework core
loads it without importing anything from here. The corpus imitates the built-in envs' formats,
which is why this tooling sits next to them.
"""
