import sys, re, collections
keys = {
 'token lookup (api_token_active)': 'api_token_active',
 'throttle (Redis EVALSHA)': 'SharedCacheThrottle.allow_request',
 'pool checkout + health check': 'BaseDatabaseWrapper.connect',
 'schedule view body (PaymentScheduleView.post)': 'PaymentScheduleView.post',
 'status view body (PaymentDetailView.get)': 'PaymentDetailView.get',
 'content negotiation': 'perform_content_negotiation',
 'response render/finalize': 'finalize_response',
 'WSGI app total (WSGIHandler.__call__)': 'WSGIHandler.__call__',
 'gunicorn handle (incl app)': 'ThreadWorker.handle ',
 'metrics middleware own': None,
}
tot=0; c=collections.Counter()
for f in sys.argv[1:]:
    for line in open(f):
        stack,_,n=line.rstrip().rpartition(' '); n=int(n); tot+=n
        for k,pat in keys.items():
            if pat and pat in stack: c[k]+=n
for k in keys:
    if keys[k]: print(f"{100*c[k]/tot:5.1f}%  {k}")
print('total samples', tot)
