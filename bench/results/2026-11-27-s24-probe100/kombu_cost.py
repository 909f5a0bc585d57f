"""CPU per message of a kombu publish + get + ack on Redis, stock transport vs ours."""
import sys, time
sys.path.insert(0, ".")  # run from the repository root
from kombu import Connection, Exchange, Producer, Queue
from scheduler_project.redis_transport import register
register()
N = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
def run(scheme):
    conn = Connection(f"{scheme}://127.0.0.1:6379/14")
    ch = conn.channel()
    q = Queue("kc", Exchange("kc"), "kc")(ch); q.declare(); q.purge()
    prod = Producer(ch)
    for _ in range(200):  # warm
        prod.publish({"x": 1}, exchange=q.exchange, routing_key="kc"); q.get(no_ack=False).ack()
    t = time.process_time()
    for _ in range(N):
        prod.publish({"x": 1}, exchange=q.exchange, routing_key="kc")
        m = q.get(no_ack=False); m.ack()
    return (time.process_time() - t) / N * 1e6
for arm in sys.argv[1].split(","):
    print(arm, f"{run(arm):.1f} us/message")
