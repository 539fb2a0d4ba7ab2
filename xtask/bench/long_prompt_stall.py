"""How long a running chat's stream pauses while a ~3,000-token prompt joins its batch
(`--max-batch 2`, SmolLM2 from the model store, greedy, 3 rounds after a `reset` each): the
longest gap between its deltas, and when the long prompt's first token came.

Usage: python3 xtask/bench/long_prompt_stall.py WORKER_BIN   (a release worker, run from its target dir)
"""
import json, os, subprocess, sys, time
worker = sys.argv[1]
p = subprocess.Popen([worker, '--max-batch', '2'], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
def send(o): p.stdin.write(json.dumps(o) + "\n"); p.stdin.flush()
def call(i, m, params):
    send({"jsonrpc": "2.0", "id": i, "method": m, "params": params})
    while True:
        r = json.loads(p.stdout.readline())
        if r.get('id') == i: return r
call(0, 'initialize', {}); call(1, 'load', {"model": os.path.expanduser("~/.cache/mlx-worker/models/SmolLM2-135M-Instruct")})
long = "The quick brown fox jumps over the lazy dog by the river. " * 230
for rnd in range(3):
    call(2, 'reset', {})
    send({"jsonrpc": "2.0", "id": 10, "method": "generate", "params": {"messages": [{"role": "user", "content": "Write a long story about a dragon."}], "max_new_tokens": 150, "temperature": 0}})
    times, sent_b, b_first, done = [], None, None, 0
    while done < 2:
        m = json.loads(p.stdout.readline())
        if m.get('method') == 'generate/delta':
            rid = m['params']['request_id']
            if rid == 10:
                times.append(time.time())
                if sent_b is None:
                    sent_b = time.time()
                    send({"jsonrpc": "2.0", "id": 11, "method": "generate", "params": {"messages": [{"role": "user", "content": long}], "max_new_tokens": 4, "temperature": 0}})
            elif b_first is None:
                b_first = time.time()
        elif m.get('id') in (10, 11):
            done += 1
            if m['id'] == 11: ptoks = m['result']['usage']['prompt_tokens']
    gaps = [b - a for a, b in zip(times, times[1:])]
    print(f"prompt {ptoks} tokens: long prompt's first token {b_first - sent_b:.2f} s after it was sent; "
          f"longest pause in the running stream {max(gaps):.2f} s; median gap {sorted(gaps)[len(gaps)//2]*1000:.0f} ms")
send({"jsonrpc": "2.0", "id": 99, "method": "shutdown", "params": {}})
