"""Ratios from bench.py's bench.json files: ratio of medians, median of per-round (paired) ratios,
and in how many rounds the worker was faster. Usage: python3 xtask/cuda/summarize.py docs/bench/cuda-h200/*.json"""
import json,statistics,sys
for f in sys.argv[1:]:
    r=json.load(open(f)); print(f, r['runs'], 'runs')
    for n,e in r['prompts'].items():
        w,m=e['samples']['worker'],e['samples']['mlx-lm']
        out=[]
        for k in ('prompt_tps','decode_tps'):
            paired=statistics.median(a[k]/b[k] for a,b in zip(w,m))
            med=statistics.median(a[k] for a in w)/statistics.median(b[k] for b in m)
            wins=sum(a[k]>b[k] for a,b in zip(w,m))
            out.append(f"{k}: worker {statistics.median(a[k] for a in w):.0f} mlx-lm {statistics.median(b[k] for b in m):.0f} ratio-of-medians {med:.2f} paired-median {paired:.2f} worker-faster {wins}/{len(w)}")
        print(' ',n,w[0]['prompt_tokens'],'|'.join(out))
