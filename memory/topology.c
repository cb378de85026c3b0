/* hwloc topology, rank placement, CPU binding and NUMA-bound allocation. */
#include "memory/topology.h"

#include <errno.h>
#include <hwloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"

struct tsr_topology {
    hwloc_topology_t topo;
    char source[200];
};

static bool tsr__ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Those three map X11, OpenCL, libxml2, ICU and libstdc++ into the process: 2.7 MiB of
 * resident pages, a third of what a small model's run holds besides its weights. GPU
 * locality needs only hwloc_pci (and the CUDA/NVML plugins where a site builds them), and an
 * XML topology reads through hwloc's built-in parser without hwloc_xml_libxml. */
void tsr_topology_preinit(void) {
    const char *b = getenv("HWLOC_PLUGINS_BLACKLIST"), *c = getenv("HWLOC_COMPONENTS");
    if ((b && *b) || (c && *c)) return;
    if (setenv("HWLOC_PLUGINS_BLACKLIST", "hwloc_gl,hwloc_opencl,hwloc_xml_libxml", 0) != 0)
        TSR_LOG_DEBUG("setenv HWLOC_PLUGINS_BLACKLIST: %s", strerror(errno));
}

tsr_status tsr_topology_load(const char *spec, tsr_topology **out) {
    *out = NULL;
    tsr_topology_preinit(); /* for callers that start no MPI (tsr_dist_start calls it first) */
    bool cpu_only = spec && strcmp(spec, "system-cpu") == 0;
    bool system = !spec || !*spec || strcmp(spec, "system") == 0 || cpu_only;
    tsr_topology *t = tsr_calloc(1, sizeof *t);
    if (!t) return TSR_ERR_NOMEM;
    if (hwloc_topology_init(&t->topo) != 0) {
        tsr_free(t);
        return tsr_error_set(TSR_ERR_INTERNAL, "hwloc_topology_init: %s", strerror(errno));
    }
    /* GPUs and their bridges are what locality needs; other I/O is noise. */
    hwloc_topology_set_io_types_filter(t->topo, cpu_only ? HWLOC_TYPE_FILTER_KEEP_NONE
                                                         : HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    int rc = 0;
    if (system) {
        snprintf(t->source, sizeof t->source, "this machine%s", cpu_only ? ", no I/O" : "");
    } else if (tsr__ends_with(spec, ".xml")) {
        snprintf(t->source, sizeof t->source, "XML %s", spec);
        rc = hwloc_topology_set_xml(t->topo, spec);
    } else {
        snprintf(t->source, sizeof t->source, "synthetic %s", spec);
        rc = hwloc_topology_set_synthetic(t->topo, spec);
    }
    if (rc == 0) rc = hwloc_topology_load(t->topo);
    if (rc != 0) {
        int e = errno;
        hwloc_topology_destroy(t->topo);
        tsr_free(t);
        if (system)
            return tsr_error_set(TSR_ERR_IO, "hwloc: cannot load this machine's topology: %s",
                                 strerror(e));
        return tsr_error_set(tsr__ends_with(spec, ".xml") ? TSR_ERR_IO : TSR_ERR_FORMAT,
                             "%s: not a valid hwloc %s topology (%s)", spec,
                             tsr__ends_with(spec, ".xml") ? "XML" : "synthetic", strerror(e));
    }
    *out = t;
    return TSR_OK;
}

void tsr_topology_destroy(tsr_topology *t) {
    if (!t) return;
    hwloc_topology_destroy(t->topo);
    tsr_free(t);
}

bool tsr_topology_is_this_system(const tsr_topology *t) {
    return hwloc_topology_is_thissystem(t->topo) != 0;
}

static int tsr__count(const tsr_topology *t, hwloc_obj_type_t type) {
    int n = hwloc_get_nbobjs_by_type(t->topo, type);
    return n < 0 ? 0 : n;
}
int tsr_topology_n_packages(const tsr_topology *t) { return tsr__count(t, HWLOC_OBJ_PACKAGE); }
int tsr_topology_n_numa(const tsr_topology *t) { return tsr__count(t, HWLOC_OBJ_NUMANODE); }
int tsr_topology_n_cores(const tsr_topology *t) { return tsr__count(t, HWLOC_OBJ_CORE); }
int tsr_topology_n_pus(const tsr_topology *t) { return tsr__count(t, HWLOC_OBJ_PU); }

int tsr_topology_describe(const tsr_topology *t, char *buf, size_t cap) {
    return snprintf(buf, cap, "%d packages, %d NUMA nodes, %d cores, %d PUs (%s)",
                    tsr_topology_n_packages(t), tsr_topology_n_numa(t), tsr_topology_n_cores(t),
                    tsr_topology_n_pus(t), t->source);
}

/* The unit ranks get slices of: cores, or PUs on a machine hwloc reports no cores for. */
static hwloc_obj_type_t tsr__unit(const tsr_topology *t) {
    return tsr_topology_n_cores(t) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
}

static int tsr__units_in(const tsr_topology *t, hwloc_const_cpuset_t set) {
    int n = hwloc_get_nbobjs_inside_cpuset_by_type(t->topo, set, tsr__unit(t));
    return n < 0 ? 0 : n;
}

int tsr_topology_numa_near_pci(const tsr_topology *t, const char *busid) {
    if (!busid || !*busid) return -1;
    hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(t->topo, busid);
    if (!dev) return -1;
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t->topo, dev);
    if (!anc || !anc->nodeset) return -1;
    int n = tsr_topology_n_numa(t);
    hwloc_obj_t root = hwloc_get_root_obj(t->topo);
    /* Hanging off the whole machine says nothing about locality. */
    if (n > 1 && hwloc_bitmap_isequal(anc->nodeset, root->nodeset)) return -1;
    for (int i = 0; i < n; i++) {
        hwloc_obj_t node = hwloc_get_obj_by_type(t->topo, HWLOC_OBJ_NUMANODE, (unsigned)i);
        if (hwloc_bitmap_isset(anc->nodeset, node->os_index) &&
            tsr__units_in(t, node->cpuset) > 0)
            return i;
    }
    return -1;
}

/* The cpuset of a placement: the union of its cores. Caller frees. */
static hwloc_bitmap_t tsr__cpuset(const tsr_topology *t, const tsr_placement *p) {
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set) return NULL;
    for (int i = 0; i < p->n_cores; i++) {
        hwloc_obj_t o =
            hwloc_get_obj_by_type(t->topo, tsr__unit(t), (unsigned)(p->core_first + i));
        if (o) hwloc_bitmap_or(set, set, o->cpuset);
    }
    return set;
}

tsr_status tsr_topology_place(const tsr_topology *t, int local_size,
                              const char *const *busids, tsr_placement *out) {
    if (local_size < 1)
        return tsr_error_set(TSR_ERR_INVALID, "topology: cannot place %d ranks", local_size);
    int n_all = tsr_topology_n_numa(t);
    /* NUMA nodes with CPUs, in logical order (memory-only nodes hold no ranks). */
    int *nodes = tsr_calloc((size_t)(n_all > 0 ? n_all : 1), sizeof *nodes);
    int *node_of = tsr_calloc((size_t)local_size, sizeof *node_of);
    if (!nodes || !node_of) {
        tsr_free(nodes);
        tsr_free(node_of);
        return TSR_ERR_NOMEM;
    }
    int n = 0;
    for (int i = 0; i < n_all; i++) {
        hwloc_obj_t node = hwloc_get_obj_by_type(t->topo, HWLOC_OBJ_NUMANODE, (unsigned)i);
        if (tsr__units_in(t, node->cpuset) > 0) nodes[n++] = i;
    }
    tsr_status st = TSR_OK;
    if (n == 0) {
        st = tsr_error_set(TSR_ERR_UNSUPPORTED, "topology (%s): no NUMA node with CPUs",
                           t->source);
        goto done;
    }
    for (int r = 0; r < local_size; r++) {
        tsr_placement *p = &out[r];
        memset(p, 0, sizeof *p);
        p->local_rank = r;
        const char *bus = busids ? busids[r] : NULL;
        if (bus) snprintf(p->device, sizeof p->device, "%s", bus);
        int near = tsr_topology_numa_near_pci(t, bus);
        node_of[r] = -1;
        for (int k = 0; k < n && near >= 0; k++)
            if (nodes[k] == near) node_of[r] = k;
        p->near_device = node_of[r] >= 0;
        if (node_of[r] < 0) node_of[r] = (int)((long long)r * n / local_size);
    }
    for (int r = 0; r < local_size; r++) {
        tsr_placement *p = &out[r];
        int k = node_of[r], m = 0, j = 0;
        for (int q = 0; q < local_size; q++) {
            if (node_of[q] != k) continue;
            if (q < r) j++;
            m++;
        }
        hwloc_obj_t node = hwloc_get_obj_by_type(t->topo, HWLOC_OBJ_NUMANODE, (unsigned)nodes[k]);
        int units = tsr__units_in(t, node->cpuset);
        hwloc_obj_t first = hwloc_get_obj_inside_cpuset_by_type(t->topo, node->cpuset,
                                                                 tsr__unit(t), 0);
        p->numa_node = nodes[k];
        p->numa_os = (int)node->os_index;
        hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(t->topo, HWLOC_OBJ_PACKAGE, first);
        p->package = pkg ? (int)pkg->logical_index : -1;
        if (m <= units) {
            int b = (int)((long long)j * units / m), e = (int)((long long)(j + 1) * units / m);
            p->core_first = (int)first->logical_index + b;
            p->n_cores = e - b;
        } else {
            p->core_first = (int)first->logical_index + (int)((long long)j * units / m);
            p->n_cores = 1;
            p->shared_cores = true;
        }
        hwloc_bitmap_t set = tsr__cpuset(t, p);
        if (!set) {
            st = TSR_ERR_NOMEM;
            goto done;
        }
        hwloc_bitmap_list_snprintf(p->cpus, sizeof p->cpus, set);
        hwloc_bitmap_free(set);
    }
done:
    tsr_free(nodes);
    tsr_free(node_of);
    return st;
}

tsr_status tsr_topology_bind(const tsr_topology *t, const tsr_placement *p) {
    if (!tsr_topology_is_this_system(t))
        return tsr_error_set(TSR_ERR_UNSUPPORTED, "topology (%s) is not this machine: cannot "
                             "bind local rank %d", t->source, p->local_rank);
    hwloc_bitmap_t set = tsr__cpuset(t, p);
    if (!set) return TSR_ERR_NOMEM;
    int rc = hwloc_set_cpubind(t->topo, set, HWLOC_CPUBIND_PROCESS);
    int e = errno;
    hwloc_bitmap_free(set);
    if (rc != 0)
        return tsr_error_set(TSR_ERR_IO, "hwloc_set_cpubind(local rank %d to PUs %s): %s",
                             p->local_rank, p->cpus, strerror(e));
    return TSR_OK;
}

tsr_status tsr_topology_alloc(const tsr_topology *t, const tsr_placement *p, size_t bytes,
                              void **out, bool *bound) {
    *out = NULL;
    if (bound) *bound = false;
    if (bytes == 0) return tsr_error_set(TSR_ERR_INVALID, "topology: 0-byte allocation");
    hwloc_obj_t node = hwloc_get_obj_by_type(t->topo, HWLOC_OBJ_NUMANODE, (unsigned)p->numa_node);
    void *ptr = NULL;
    if (node && tsr_topology_is_this_system(t)) {
        /* STRICT: a failure to bind is reported, so that we know the truth and fall back. */
        ptr = hwloc_alloc_membind(t->topo, bytes, node->nodeset, HWLOC_MEMBIND_BIND,
                                  HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT);
        if (ptr && bound) *bound = true;
    }
    if (!ptr) ptr = hwloc_alloc(t->topo, bytes);
    if (!ptr)
        return tsr_error_set(TSR_ERR_NOMEM, "topology: cannot allocate %zu bytes on NUMA node %d",
                             bytes, p->numa_node);
    *out = ptr;
    return TSR_OK;
}

void tsr_topology_free(const tsr_topology *t, void *ptr, size_t bytes) {
    if (ptr) hwloc_free(t->topo, ptr, bytes);
}

int tsr_topology_format_placement(const tsr_placement *p, int n, char *buf, size_t cap) {
    size_t len = 0;
    if (cap > 0) buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        char cores[32];
        if (p[i].n_cores == 1)
            snprintf(cores, sizeof cores, "core %d", p[i].core_first);
        else
            snprintf(cores, sizeof cores, "cores %d-%d", p[i].core_first,
                     p[i].core_first + p[i].n_cores - 1);
        char dev[48] = "";
        if (p[i].device[0])
            snprintf(dev, sizeof dev, ", %s GPU %s", p[i].near_device ? "near" : "unplaced",
                     p[i].device);
        int w = snprintf(len < cap ? buf + len : NULL, len < cap ? cap - len : 0,
                         "local rank %d: NUMA node %d (os %d, package %d), %s%s, PUs %s%s\n",
                         p[i].local_rank, p[i].numa_node, p[i].numa_os, p[i].package, cores,
                         p[i].shared_cores ? " (shared)" : "", p[i].cpus, dev);
        if (w > 0) len += (size_t)w;
    }
    return (int)len;
}
