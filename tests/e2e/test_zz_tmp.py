import time
from pathlib import Path
from hack.localcluster.realnode import RealNode

def test_time_nodes(control_plane, node_bin_dir, short_tmp, unique):
    for i in range(3):
        node = RealNode(f"tm{i}-{unique}", node_bin_dir, control_plane, short_tmp / f"n{i}")
        t0 = time.monotonic()
        node.start()
        t1 = time.monotonic()
        node.start_plugin()
        t2 = time.monotonic()
        node.stop()
        t3 = time.monotonic()
        print(f"\nstart {t1-t0:.1f} plugin {t2-t1:.1f} stop {t3-t2:.1f}", flush=True)
