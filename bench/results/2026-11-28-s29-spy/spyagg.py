import collections,sys
WAIT=('Connection.wait','select ','EpollSelector.select','Condition.wait','_worker concurrent','SimpleQueue.get','Queue.get','sleep','recv','poll','_wait_conn','wait_c','Event.wait','readline','_read_status','accept')
tot=0; waits=0; incl=collections.Counter(); leaf=collections.Counter()
def name(fr):
    return fr.split(' (')[0]+' '+(fr.split('(')[-1].split(':')[0].split('/')[-1] if '(' in fr else '')
for f in sys.argv[2:]:
    for line in open(f):
        line=line.rstrip()
        if not line: continue
        stack,_,n=line.rpartition(' '); n=int(n)
        frames=[name(x) for x in stack.split(';')]
        if any(frames[-1].startswith(w) or w in frames[-1] for w in WAIT):
            waits+=n; continue
        tot+=n
        for k in set(frames): incl[k]+=n
        leaf[frames[-1]]+=n
print('busy samples',tot,'wait samples',waits)
for k,v in incl.most_common(int(sys.argv[1])): print(f'{v:6d} {100*v/tot:5.1f}% {k}')
print('--- leaves')
for k,v in leaf.most_common(25): print(f'{v:6d} {100*v/tot:5.1f}% {k}')
