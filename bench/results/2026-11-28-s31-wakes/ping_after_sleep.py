import socket, time, os
def rt():
    return int(open(f"/proc/self/task/{os.getpid()}/schedstat").read().split()[0])
s=socket.create_connection(("127.0.0.1",6379))
for label, n, gap in [("gap0",2000,0),("gap300ms",20,0.3)]:
    w=0; r_in=0; r_out=0
    for i in range(n):
        a=rt(); t=time.perf_counter()
        s.sendall(b"PING\r\n"); s.recv(100)
        w+=time.perf_counter()-t; b=rt(); r_in+=b-a
        if gap: time.sleep(gap)
        r_out+=rt()-b
    print(f"{label}: wall in ping {w/n*1e6:.0f} us, run in ping {r_in/n/1000:.0f} us, run across sleep {r_out/n/1000:.0f} us")
