#!/bin/bash
cd /app
wc -w < poem.txt | tr -d ' ' > out/count.txt
tac poem.txt > out/reversed.txt
