# usage: idlemeasure.sh label extra-args...
label=$1; shift
cd "${ROOT:-/work/main}"
export DATABASE_URL=postgres://postgres@127.0.0.1:5432/idle_s31 CELERY_BROKER_URL=redis://127.0.0.1:6379/12 SECRET_KEY=x DJANGO_SETTINGS_MODULE=scheduler_project.settings.base ALLOWED_HOSTS=localhost PROMETHEUS_MULTIPROC_DIR=/tmp/idle_prom
.venv/bin/celery -A scheduler_project worker --pool solo --without-mingle --without-gossip -X timers,recurring,webhooks,default -l WARNING -n idle.1@%h "$@" > /tmp/idle1.log 2>&1 &
sleep 15; p=$(pgrep -f "idle\.1@")
snap(){ for t in /proc/$p/task/*; do cat $t/schedstat; done | awk '{r+=$1; n+=$3} END {print r, n}'; }
for t in /proc/$p/task/*; do echo "  $(basename $t) $(cat $t/comm) $(cat $t/schedstat)"; done; a=$(snap); sleep 30; b=$(snap); for t in /proc/$p/task/*; do echo "  $(basename $t) $(cat $t/comm) $(cat $t/schedstat)"; done
echo "$label: $(echo $a $b | awk '{printf "%.1f ms/s charged, %.2f wakeups/s", ($3-$1)/30/1e6, ($4-$2)/30}')"
kill $p; sleep 2
