#!/bin/bash
# Harbor verifier: scores the agent's files and writes the reward.
cd /app
if python3 /tests/test_outputs.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
