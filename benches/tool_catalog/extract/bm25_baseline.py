import json, glob, os, re, math, collections
import sys
D=sys.argv[1] if len(sys.argv)>1 else '.'
docs=[]
for f in sorted(glob.glob(D+'/servers/*.json')):
    sid=os.path.basename(f)[:-5]
    for t in json.load(open(f))['tools']:
        props=t['inputSchema'].get('properties',{})
        txt=' '.join([sid, t['name'], t.get('title',''), t['description']]+[k+' '+str(v.get('description','')) for k,v in props.items() if isinstance(v,dict)])
        docs.append((sid+'__'+t['name'], txt))
tok=lambda s:[w for w in re.findall(r'[a-z0-9]+', re.sub(r'([a-z])([A-Z])',r'\1 \2',s).lower().replace('_',' ')) ]
TD=[collections.Counter(tok(t)) for _,t in docs]
N=len(docs); avg=sum(sum(c.values()) for c in TD)/N
df=collections.Counter(w for c in TD for w in c)
def score(q):
    qs=tok(q); out=[]
    for i,c in enumerate(TD):
        L=sum(c.values()); s=0
        for w in qs:
            if w in c:
                idf=math.log(1+(N-df[w]+.5)/(df[w]+.5)); tf=c[w]
                s+=idf*tf*2.2/(tf+1.2*(1-.75+.75*L/avg))
        out.append((s,docs[i][0]))
    return sorted(out,reverse=True)
Q=json.load(open(D+'/queries.json'))
r1=r5=0
for q in Q:
    top=score(q['query'])[:5]; names=[n for _,n in top]
    rank=names.index(q['expected'])+1 if q['expected'] in names else None
    r1+=rank==1; r5+=rank is not None
    print(rank, q['expected'], '<-', q['query'][:70], '| top:', names[:3])
print('recall@1',r1/len(Q),'recall@5',r5/len(Q), 'N',N)
