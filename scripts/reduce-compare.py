#!/usr/bin/env python3
"""Issue #19: --reduce direct against --reduce scatter, alternating, same run.

For each tensor width T: T node daemons on loopback (--daemons) or T
in-process nodes (optionally --link BW:LAT), then ROUNDS rounds of one
`cellshard run --reduce direct` and one `--reduce scatter`; prints tokens/s,
the busiest link's and the busiest rank's bytes per token (between nodes,
from run --json), and the median of the per-round ratios scatter / direct.
Every daemon is killed at the end (SIGKILL + wait), also on errors.

  scripts/reduce-compare.py -m MODEL -z TOKENIZER --tp 2,4,8 --rounds 3 -n 48 --daemons
"""
import argparse, json, os, signal, statistics, subprocess, sys, tempfile

ap = argparse.ArgumentParser()
ap.add_argument('--bin', default=os.path.join(os.path.dirname(__file__), '..', 'build', 'tools', 'cellshard'))
ap.add_argument('-m', '--model', required=True)
ap.add_argument('-z', '--tokenizer', required=True, help='must sit in the model\'s folder with --daemons')
ap.add_argument('--tp', default='2,4,8')
ap.add_argument('--rounds', type=int, default=3)
ap.add_argument('-n', '--steps', default='48')
ap.add_argument('--daemons', action='store_true', help='node daemons on loopback instead of in-process nodes')
ap.add_argument('--link', default='', help='in-process link BW:LAT')
ap.add_argument('-i', '--prompt', default='', help='a prompt: compares the prefill too (ttft)')
ap.add_argument('--timeout', type=int, default=600, help='seconds per run')
a = ap.parse_args()
tmp = tempfile.mkdtemp(prefix='reduce-compare-')


def one_run(T, alg, cluster):
    jf = os.path.join(tmp, f'{T}_{alg}.json')
    cmd = [a.bin, 'run', '-m', a.model, '-z', a.tokenizer, '--topology', f'tensor:{T}', '--reduce', alg,
           '-n', a.steps, '-t', '0', '--json', jf] + (['-i', a.prompt] if a.prompt else [])
    cmd += ['--cluster', cluster] if cluster else ['--nodes', str(T)] + (['--link', a.link] if a.link else [])
    cp = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=a.timeout)
    if cp.returncode != 0:
        sys.exit(f'tensor:{T} --reduce {alg} failed: {cp.stderr[-800:]}')
    j = json.load(open(jf))
    links = [l for l in j['links'] if isinstance(l['from'], int) and isinstance(l['to'], int)]
    per_rank = {}
    for l in links:
        per_rank[l['from']] = per_rank.get(l['from'], 0) + l['bytes_per_token']
    return (j['tokens_per_s'], max((l['bytes_per_token'] for l in links), default=0), max(per_rank.values(), default=0),
            j['ttft_ms'])


for T in [int(t) for t in a.tp.split(',')]:
    procs, cluster = [], ''
    try:
        if a.daemons:
            nodes = []
            for _ in range(T):
                p = subprocess.Popen([a.bin, 'node', '--listen', '127.0.0.1:0', '--models',
                                      os.path.dirname(os.path.abspath(a.model)), '-q'],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                procs.append(p)
                nodes.append({'host': '127.0.0.1', 'port': int(p.stdout.readline().strip().rsplit(':', 1)[1])})
            cluster = os.path.join(tmp, f'cluster{T}.json')
            json.dump({'nodes': nodes}, open(cluster, 'w'))
        runs = {'direct': [], 'scatter': []}
        for r in range(a.rounds):
            for alg in ('direct', 'scatter'):
                runs[alg].append(one_run(T, alg, cluster))
                tps, link, rank, ttft = runs[alg][-1]
                print(f'T={T} {alg:7s} round {r}: {tps:8.2f} tok/s, ttft {ttft:.1f} ms, busiest link {link:.0f} '
                      f'B/token, busiest rank {rank:.0f} B/token', flush=True)
        d, s = runs['direct'], runs['scatter']
        ratio = statistics.median(y[0] / x[0] for x, y in zip(d, s))
        print(f'T={T}: scatter/direct tokens/s {ratio:.3f} (median of per-round ratios); direct '
              f'{statistics.median(x[0] for x in d):.2f}, scatter {statistics.median(x[0] for x in s):.2f} tok/s; '
              f'busiest link {d[0][1]:.0f} -> {s[0][1]:.0f} B/token, busiest rank {d[0][2]:.0f} -> {s[0][2]:.0f}',
              flush=True)
        if a.prompt:
            print(f'T={T}: scatter/direct ttft {statistics.median(y[3] / x[3] for x, y in zip(d, s)):.3f} '
                  f'(median of per-round ratios)', flush=True)
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
