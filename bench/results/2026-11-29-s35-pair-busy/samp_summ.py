"""Per-step lock-wait samples and executor counters from sampler.py's lines.
Usage: python3 samp_summ.py DIR NAME  (reads DIR/NAME.sampler.jsonl and DIR/NAME.log)"""
import json,sys,re
root,name=sys.argv[1],sys.argv[2]
rows=[json.loads(l) for l in open(f'{root}/{name}.sampler.jsonl')]
marks=[(0,'start')]
for l in open(f'{root}/{name}.log'):
    t,rest=l.split(' ',1)
    m=re.match(r'\s*(\d+)/s:',rest)
    if m or 'idle:' in rest: marks.append((int(t), m.group(1) if m else 'idle'))
for (a,_),(b,lab) in zip(marks,marks[1:]):
    seg=[r for r in rows if a<=r['t']<b]
    if not seg: continue
    locks=sum(r['locks'] for r in seg); act=sum(r['active'] for r in seg)
    k=lambda r,n: r.get(n) or 0
    d=lambda n: k(seg[-1],n)-k(seg[0],n)
    lq={}
    for r in seg:
        for q,c in r['lockq'].items(): lq[q[:30]]=lq.get(q[:30],0)+c
    print(lab, 'secs',len(seg),'lockwait samples',locks,'active samples',act,'stale',d('payments_stale_deliveries_total'),'collapsed',d('payments_collapsed_total'),'batches',d('payments_executor_batch_size_count'),'busy',d('payments_chunk_items_busy_total'), sorted(lq.items(),key=lambda x:-x[1])[:3])
