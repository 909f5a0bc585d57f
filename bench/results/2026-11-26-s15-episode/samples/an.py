import json,sys,time
rows=[json.loads(l) for l in open('samples.jsonl')]
t0=rows[0]['t']
lo,hi=float(sys.argv[1]),float(sys.argv[2])
prev=None
for r in rows:
    if 'table' not in r: prev=None; continue
    if prev and lo<=r['t']-t0<=hi:
        c=r['cpu']; od={k[0]:(n,round(float(a or 0),1)) for k,n,a in r.get('overdue',[])}
        q=sum(v for k,v in r['queues'].items() if k.split(':')[1] not in ('recurring','webhooks','timers','default'))
        d=r['db']; bg=r['bgwriter']; pd=prev['db']; pb=prev['bgwriter']
        act={k[:12]:v for k,v in r['activity']}
        print(f"{time.strftime('%H:%M:%S',time.gmtime(r['t']))} {r['t']-t0:4.0f} pg {c.get('postgres',0):4.2f} wk {c.get('worker',0):4.2f} tm {c.get('timers',0):4.2f} web {c.get('web',0):4.2f} cm {d[0]-pd[0]:4d} upd {d[5]-pd[5]:5d} rd {d[2]-pd[2]:4d} bk {bg[4]-pb[4]:4d} ck {bg[2]-pb[2]:4d} wal {(int(r['wal_lsn'])-int(prev['wal_lsn']))//1024:5d}k dead {r['table'][1]:6d} q {q:4d} od {od} {act} smp {r['sample_s']}")
    prev=r
