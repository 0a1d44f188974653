#!/usr/bin/env python3
"""Writes the hwloc XML topologies used by the launch placement tests.

Each topology is: Machine -> Package -> Group (one per NUMA node, holding the NUMANode, its cores
and the PCI GPUs attached to it). Cores have one PU each; core i is PU i. The GPUs are NVIDIA
3D controllers (class 0302, vendor 10de) whose PCI bus ids sort in GPU index order, as NVML and
CUDA_DEVICE_ORDER=PCI_BUS_ID number them.

    python3 gen_topologies.py   (rewrites the .xml files next to this script)
"""
import os

def mask(bits):
    v = 0
    for b in bits:
        v |= 1 << b
    return "0x%08x" % v if v < (1 << 32) else hex(v)

def topology(packages, numa_per_pkg, cores_per_numa, gpus):
    """gpus: list of (numa index, pci bus number), in any order; index = order of bus ids."""
    gp = [1]
    def nxt():
        gp[0] += 1
        return gp[0]
    ncores = packages * numa_per_pkg * cores_per_numa
    nnuma = packages * numa_per_pkg
    out = ['<?xml version="1.0" encoding="UTF-8"?>', '<!DOCTYPE topology SYSTEM "hwloc2.dtd">',
           '<topology version="2.0">']
    allc, alln = mask(range(ncores)), mask(range(nnuma))
    out.append(f'  <object type="Machine" os_index="0" cpuset="{allc}" complete_cpuset="{allc}" '
               f'allowed_cpuset="{allc}" nodeset="{alln}" complete_nodeset="{alln}" allowed_nodeset="{alln}" gp_index="1">')
    for p in range(packages):
        numas = range(p * numa_per_pkg, (p + 1) * numa_per_pkg)
        pc = mask(c for n in numas for c in range(n * cores_per_numa, (n + 1) * cores_per_numa))
        pn = mask(numas)
        out.append(f'    <object type="Package" os_index="{p}" cpuset="{pc}" complete_cpuset="{pc}" '
                   f'nodeset="{pn}" complete_nodeset="{pn}" gp_index="{nxt()}">')
        for n in numas:
            cores = range(n * cores_per_numa, (n + 1) * cores_per_numa)
            nc, nn = mask(cores), mask([n])
            out.append(f'      <object type="Group" cpuset="{nc}" complete_cpuset="{nc}" nodeset="{nn}" '
                       f'complete_nodeset="{nn}" gp_index="{nxt()}" kind="10" subkind="0">')
            out.append(f'        <object type="NUMANode" os_index="{n}" cpuset="{nc}" complete_cpuset="{nc}" '
                       f'nodeset="{nn}" complete_nodeset="{nn}" gp_index="{nxt()}" local_memory="68719476736"/>')
            for c in cores:
                m = mask([c])
                out.append(f'        <object type="Core" os_index="{c}" cpuset="{m}" complete_cpuset="{m}" '
                           f'nodeset="{nn}" complete_nodeset="{nn}" gp_index="{nxt()}">')
                out.append(f'          <object type="PU" os_index="{c}" cpuset="{m}" complete_cpuset="{m}" '
                           f'nodeset="{nn}" complete_nodeset="{nn}" gp_index="{nxt()}"/>')
                out.append('        </object>')
            for (gn, bus) in gpus:
                if gn == n:
                    out.append(f'        <object type="PCIDev" gp_index="{nxt()}" pci_busid="0000:{bus:02x}:00.0" '
                               f'pci_type="0302 [10de:20b0] [10de:134f] a1" pci_link_speed="31.507692"/>')
            out.append('      </object>')
        out.append('    </object>')
    out.append('  </object>')
    out.append('</topology>')
    return "\n".join(out) + "\n"

TOPOLOGIES = {
    # 2 sockets x 1 NUMA x 8 cores; GPUs 0..3 alternate between the sockets.
    "2s-4gpu-alt.xml": topology(2, 1, 8, [(0, 0x01), (1, 0x21), (0, 0x41), (1, 0x61)]),
    # 2 sockets x 2 NUMA x 4 cores; GPUs 0..7 on NUMA 0,1,2,3,0,1,2,3 in bus order.
    "2s4n-8gpu-alt.xml": topology(2, 2, 4, [(0, 0x01), (1, 0x11), (2, 0x21), (3, 0x31),
                                              (0, 0x41), (1, 0x51), (2, 0x61), (3, 0x71)]),
    # HGX-like: 2 sockets x 4 NUMA x 4 cores; GPU pairs sit on NUMA 3,1,7,5 (bus order does not
    # follow NUMA order, as on DGX A100 with NPS4).
    "hgx-8gpu.xml": topology(2, 4, 4, [(3, 0x07), (3, 0x0f), (1, 0x47), (1, 0x4e),
                                         (7, 0x87), (7, 0x90), (5, 0xb7), (5, 0xbd)]),
    # 2 sockets x 1 NUMA x 4 cores, no GPU.
    "2s-nogpu.xml": topology(2, 1, 4, []),
}

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    for name, text in TOPOLOGIES.items():
        with open(os.path.join(here, name), "w") as f:
            f.write(text)
