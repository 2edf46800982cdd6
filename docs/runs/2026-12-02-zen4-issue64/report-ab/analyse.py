"""Geometric mean of new/old median times over the report's kernel, layer and
format rows, three rounds alternating; the median ratio per row.

    python3 analyse.py [DIR [OLD NEW]]

reads DIR/OLD-<round>.json and DIR/NEW-<round>.json (default: this script's
directory, `old` and `new`), as `report --json` wrote them."""
import json, math, statistics, sys, glob, os
DIR = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
OLD, NEW = sys.argv[2:4] if len(sys.argv) > 3 else ('old', 'new')
def rows(path):
    d = json.load(open(path))
    out = {}
    for r in d['rows']:
        out[('kernel', r['workload'], r['kernel'], r['impl'])] = r['median_us']
    for r in d['layer_rows']:
        out[('layer', r['workload'], r['op'])] = r['median_us']
    for r in d['format_rows']:
        out[('format', r['workload'], r['op'], r['format'])] = r['median_us']
    return out
rounds = sorted({p.split('-')[-1].split('.')[0] for p in glob.glob(f'{DIR}/{OLD}-*.json')})
ratios = {}
for k in rounds:
    old, new = rows(f'{DIR}/{OLD}-{k}.json'), rows(f'{DIR}/{NEW}-{k}.json')
    for key in old.keys() & new.keys():
        if old[key] > 0 and new[key] > 0:
            ratios.setdefault(key, []).append(new[key] / old[key])
med = {k: statistics.median(v) for k, v in ratios.items() if len(v) == len(rounds)}
geo = math.exp(sum(math.log(r) for r in med.values()) / len(med))
print(f'rounds {len(rounds)}, rows {len(med)}, geomean new/old {geo:.3f}')
for group in ['kernel', 'layer', 'format']:
    g = [r for k, r in med.items() if k[0] == group]
    g and print(f'  {group}: {len(g)} rows, geomean {math.exp(sum(map(math.log, g))/len(g)):.3f}')
worst = sorted(med.items(), key=lambda kv: -kv[1])
print('rows above 1.10:', sum(1 for _, r in worst if r > 1.10))
for k, r in worst[:15]:
    print(f'  {r:.3f}  {" ".join(k)}  {["%.2f" % x for x in ratios[k]]}')
print('best:')
for k, r in worst[-8:]:
    print(f'  {r:.3f}  {" ".join(k)}')
