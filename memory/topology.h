/* Machine topology (hwloc) and where each rank of a node runs and keeps its host memory.
 *
 * A topology is the real machine, an hwloc synthetic description ("pack:2 numa:2 core:4
 * pu:1") or an hwloc XML export (which can carry PCI devices, for GPU-locality tests).
 * Placement is decided for all local ranks at once, the same on every rank of the node:
 *  - a rank with a GPU goes to the NUMA node nearest that GPU's PCI device;
 *  - a rank without one (CPU backend, or a device hwloc cannot see) takes NUMA node
 *    r * N / L (L local ranks, N NUMA nodes with cores): consecutive ranks, which form
 *    the tensor-parallel groups, share a node, and the ranks spread evenly over nodes;
 *  - the ranks on one NUMA node split its cores into disjoint, even, contiguous slices
 *    (when there are more ranks than cores, ranks share single cores).
 * Then each rank binds itself to its cores and allocates its host pool on its node. */
#ifndef TSR_MEMORY_TOPOLOGY_H
#define TSR_MEMORY_TOPOLOGY_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

typedef struct tsr_topology tsr_topology;

/* spec: NULL, "" or "system": this machine, with its PCI devices (GPU locality);
 * "system-cpu": this machine without I/O discovery (the CPU backend needs no PCI scan, and
 * libpciaccess's scan leaks a little, which LeakSanitizer reports); a path ending in ".xml":
 * an hwloc XML file; anything else: an hwloc synthetic description. */
tsr_status tsr_topology_load(const char *spec, tsr_topology **out);
/* Keeps hwloc from loading the plugins a compute job never uses (hwloc_gl, hwloc_opencl,
 * hwloc_xml_libxml) by setting HWLOC_PLUGINS_BLACKLIST, unless the user set it or
 * HWLOC_COMPONENTS. hwloc loads every plugin it finds when the process's first topology is
 * created, and MPI_Init creates one before tsr_topology_load: call this before MPI starts. */
void tsr_topology_preinit(void);
void tsr_topology_destroy(tsr_topology *t);

/* False for synthetic and XML topologies: they cannot be bound to. */
bool tsr_topology_is_this_system(const tsr_topology *t);
int tsr_topology_n_packages(const tsr_topology *t);
int tsr_topology_n_numa(const tsr_topology *t);
int tsr_topology_n_cores(const tsr_topology *t);
int tsr_topology_n_pus(const tsr_topology *t);
/* "2 packages, 4 NUMA nodes, 16 cores, 16 PUs (synthetic pack:2 numa:2 core:4 pu:1)". */
int tsr_topology_describe(const tsr_topology *t, char *buf, size_t cap);

/* Logical index of the NUMA node nearest a PCI device ("0000:65:00.0", the format of
 * cudaDeviceGetPCIBusId), or -1 when the device is unknown or equally far from all nodes. */
int tsr_topology_numa_near_pci(const tsr_topology *t, const char *busid);

typedef struct tsr_placement {
    int local_rank;
    int numa_node;           /* logical index */
    int numa_os;             /* OS index (what numactl and /sys call it) */
    int package;             /* logical index of the package holding it; -1: none */
    int core_first, n_cores; /* logical core indices [core_first, core_first + n_cores) */
    bool shared_cores;       /* more ranks than cores on the node: cores are shared */
    bool near_device;        /* the node was chosen from the device's PCI locality */
    char device[24];         /* the PCI bus id given, or "" */
    char cpus[64];           /* OS indices of the PUs ("0-3") */
} tsr_placement;

/* Places `local_size` ranks; busids may be NULL, or hold one PCI bus id (or NULL) per
 * local rank. out has local_size entries. */
tsr_status tsr_topology_place(const tsr_topology *t, int local_size,
                              const char *const *busids, tsr_placement *out);

/* Binds the calling process (all its threads) to the placement's cores. TSR_ERR_UNSUPPORTED
 * on a topology that is not this machine. */
tsr_status tsr_topology_bind(const tsr_topology *t, const tsr_placement *p);

/* Memory bound to the placement's NUMA node (hwloc_alloc_membind). When the system cannot
 * bind (no NUMA support, a synthetic topology), the memory is allocated unbound and *bound
 * (optional) says false. Free with tsr_topology_free. */
tsr_status tsr_topology_alloc(const tsr_topology *t, const tsr_placement *p, size_t bytes,
                              void **out, bool *bound);
void tsr_topology_free(const tsr_topology *t, void *ptr, size_t bytes);

/* The placement as one line per rank (for --verbose):
 * "local rank 1: NUMA node 1 (os 1, package 0), cores 4-7, PUs 4-7, near GPU 0000:65:00.0".
 * Returns the length it needed (snprintf-style). */
int tsr_topology_format_placement(const tsr_placement *p, int n, char *buf, size_t cap);

#endif
