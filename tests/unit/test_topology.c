/* memory/topology: placement on synthetic and XML topologies, binding and NUMA allocation
 * on this machine. */
#include <stdint.h>
#include <stdlib.h>

#include "memory/topology.h"
#include "base/alloc.h"
#include "tests/test.h"

#define TWO_BY_TWO "pack:2 numa:2 core:4 pu:1"

/* First, before any topology: the blacklist must be in place when hwloc loads its plugins,
 * so the XML fixture below is read by hwloc's built-in parser, as in tessera. */
TSR_TEST(test_preinit_blacklists_plugins) {
    ASSERT_TRUE(setenv("HWLOC_COMPONENTS", "linux", 1) == 0);
    tsr_topology_preinit();
    ASSERT_TRUE(getenv("HWLOC_PLUGINS_BLACKLIST") == NULL); /* the user's choice stands */
    ASSERT_TRUE(unsetenv("HWLOC_COMPONENTS") == 0);
    ASSERT_TRUE(setenv("HWLOC_PLUGINS_BLACKLIST", "hwloc_pci", 1) == 0);
    tsr_topology_preinit();
    ASSERT_STR_EQ(getenv("HWLOC_PLUGINS_BLACKLIST"), "hwloc_pci");
    ASSERT_TRUE(unsetenv("HWLOC_PLUGINS_BLACKLIST") == 0);
    tsr_topology_preinit();
    ASSERT_STR_EQ(getenv("HWLOC_PLUGINS_BLACKLIST"), "hwloc_gl,hwloc_opencl,hwloc_xml_libxml");
}

TSR_TEST(test_counts) {
    tsr_topology *t = NULL;
    ASSERT_OK(tsr_topology_load(TWO_BY_TWO, &t));
    ASSERT_EQ_INT(tsr_topology_n_packages(t), 2);
    ASSERT_EQ_INT(tsr_topology_n_numa(t), 4);
    ASSERT_EQ_INT(tsr_topology_n_cores(t), 16);
    ASSERT_EQ_INT(tsr_topology_n_pus(t), 16);
    ASSERT_TRUE(!tsr_topology_is_this_system(t));
    char buf[256];
    tsr_topology_describe(t, buf, sizeof buf);
    ASSERT_STR_EQ(buf, "2 packages, 4 NUMA nodes, 16 cores, 16 PUs (synthetic " TWO_BY_TWO ")");
    tsr_topology_destroy(t);
}

TSR_TEST(test_bad_specs) {
    tsr_topology *t = NULL;
    ASSERT_EQ_INT(tsr_topology_load("pack:two", &t), TSR_ERR_FORMAT);
    ASSERT_STR_CONTAINS(tsr_last_error(), "pack:two: not a valid hwloc synthetic topology");
    ASSERT_TRUE(t == NULL);
    ASSERT_EQ_INT(tsr_topology_load("/nonexistent/topo.xml", &t), TSR_ERR_IO);
    ASSERT_STR_CONTAINS(tsr_last_error(), "/nonexistent/topo.xml");
}

TSR_TEST(test_four_ranks_one_per_numa) {
    tsr_topology *t = NULL;
    ASSERT_OK(tsr_topology_load(TWO_BY_TWO, &t));
    tsr_placement p[4];
    ASSERT_OK(tsr_topology_place(t, 4, NULL, p));
    for (int r = 0; r < 4; r++) {
        ASSERT_EQ_INT(p[r].numa_node, r);
        ASSERT_EQ_INT(p[r].package, r / 2);
        ASSERT_EQ_INT(p[r].core_first, 4 * r);
        ASSERT_EQ_INT(p[r].n_cores, 4);
        ASSERT_TRUE(!p[r].near_device && !p[r].shared_cores);
    }
    ASSERT_STR_EQ(p[3].cpus, "12-15");
    char buf[1024];
    tsr_topology_format_placement(p, 4, buf, sizeof buf);
    ASSERT_STR_CONTAINS(buf, "local rank 0: NUMA node 0 (os 0, package 0), cores 0-3, PUs 0-3\n");
    ASSERT_STR_CONTAINS(buf,
                        "local rank 3: NUMA node 3 (os 3, package 1), cores 12-15, PUs 12-15\n");
    tsr_topology_destroy(t);
}

TSR_TEST(test_eight_ranks_two_per_numa) {
    tsr_topology *t = NULL;
    ASSERT_OK(tsr_topology_load(TWO_BY_TWO, &t));
    tsr_placement p[8];
    ASSERT_OK(tsr_topology_place(t, 8, NULL, p));
    int owner[16];
    for (int i = 0; i < 16; i++) owner[i] = -1;
    for (int r = 0; r < 8; r++) {
        ASSERT_EQ_INT(p[r].numa_node, r / 2); /* consecutive ranks (a TP pair) share a node */
        ASSERT_EQ_INT(p[r].n_cores, 2);
        for (int c = p[r].core_first; c < p[r].core_first + p[r].n_cores; c++) {
            ASSERT_EQ_INT(owner[c], -1); /* disjoint */
            owner[c] = r;
            /* the core lies inside the rank's NUMA node (4 cores per node) */
            ASSERT_EQ_INT(c / 4, p[r].numa_node);
        }
    }
    for (int i = 0; i < 16; i++) ASSERT_TRUE(owner[i] >= 0);
    ASSERT_STR_EQ(p[5].cpus, "10-11");
    tsr_topology_destroy(t);
}

TSR_TEST(test_two_ranks_spread_over_packages) {
    tsr_topology *t = NULL;
    ASSERT_OK(tsr_topology_load(TWO_BY_TWO, &t));
    tsr_placement p[2];
    ASSERT_OK(tsr_topology_place(t, 2, NULL, p));
    ASSERT_EQ_INT(p[0].numa_node, 0);
    ASSERT_EQ_INT(p[1].numa_node, 2);
    ASSERT_EQ_INT(p[1].package, 1);
    tsr_topology_destroy(t);
}

TSR_TEST(test_more_ranks_than_cores) {
    tsr_topology *t = NULL;
    ASSERT_OK(tsr_topology_load("numa:1 core:2 pu:1", &t));
    tsr_placement p[4];
    ASSERT_OK(tsr_topology_place(t, 4, NULL, p));
    for (int r = 0; r < 4; r++) {
        ASSERT_EQ_INT(p[r].n_cores, 1);
        ASSERT_EQ_INT(p[r].core_first, r / 2);
        ASSERT_TRUE(p[r].shared_cores);
    }
    tsr_topology_destroy(t);
}

#define FIXTURE TSR_SOURCE_DIR "/tests/data/topology/two_gpus.xml"

TSR_TEST(test_gpu_near_numa) {
    tsr_topology *t = NULL;
    ASSERT_OK(tsr_topology_load(FIXTURE, &t));
    ASSERT_EQ_INT(tsr_topology_n_numa(t), 2);
    /* The fixture puts GPU 0000:17:00.0 behind package 0 and 0000:65:00.0 behind package 1
     * (NUMA node 1). */
    ASSERT_EQ_INT(tsr_topology_numa_near_pci(t, "0000:65:00.0"), 1);
    ASSERT_EQ_INT(tsr_topology_numa_near_pci(t, "0000:17:00.0"), 0);
    ASSERT_EQ_INT(tsr_topology_numa_near_pci(t, "0000:99:00.0"), -1);
    /* Device order opposite to rank order: locality wins over the rank spread. */
    const char *bus[2] = {"0000:65:00.0", "0000:17:00.0"};
    tsr_placement p[2];
    ASSERT_OK(tsr_topology_place(t, 2, bus, p));
    ASSERT_EQ_INT(p[0].numa_node, 1);
    ASSERT_TRUE(p[0].near_device);
    ASSERT_STR_EQ(p[0].cpus, "2-3");
    ASSERT_EQ_INT(p[1].numa_node, 0);
    ASSERT_STR_EQ(p[1].cpus, "0-1");
    /* Two ranks on the same GPU's node share its cores; an unknown bus id falls back. */
    const char *same[3] = {"0000:99:00.0", "0000:65:00.0", "0000:65:00.0"};
    tsr_placement q[3];
    ASSERT_OK(tsr_topology_place(t, 3, same, q));
    ASSERT_TRUE(!q[0].near_device);
    ASSERT_EQ_INT(q[0].numa_node, 0); /* spread: 0 * 2 / 3 = node 0 */
    ASSERT_EQ_INT(q[0].n_cores, 2);
    ASSERT_EQ_INT(q[1].numa_node, 1);
    ASSERT_EQ_INT(q[2].numa_node, 1);
    ASSERT_EQ_INT(q[1].core_first, 2);
    ASSERT_EQ_INT(q[2].core_first, 3);
    ASSERT_EQ_INT(q[2].n_cores, 1);
    char buf[1024];
    tsr_topology_format_placement(p, 2, buf, sizeof buf);
    ASSERT_STR_CONTAINS(buf, "local rank 0: NUMA node 1 (os 1, package 1), cores 2-3, PUs 2-3, "
                             "near GPU 0000:65:00.0\n");
    /* A synthetic topology cannot be bound to. */
    ASSERT_EQ_INT(tsr_topology_bind(t, &p[0]), TSR_ERR_UNSUPPORTED);
    /* ... but the pool allocation still works (unbound). */
    void *mem = NULL;
    bool bound = true;
    ASSERT_OK(tsr_topology_alloc(t, &p[0], 4096, &mem, &bound));
    ASSERT_TRUE(mem != NULL && !bound);
    tsr_topology_free(t, mem, 4096);
    tsr_topology_destroy(t);
}

TSR_TEST(test_this_machine_bind_and_alloc) {
    tsr_topology *t = NULL;
    /* CPU-only discovery: binding and memory need no PCI scan. */
    ASSERT_OK(tsr_topology_load("system-cpu", &t));
    ASSERT_TRUE(tsr_topology_is_this_system(t));
    ASSERT_TRUE(tsr_topology_n_pus(t) >= 1);
    tsr_placement p;
    ASSERT_OK(tsr_topology_place(t, 1, NULL, &p));
    ASSERT_EQ_INT(p.numa_node, 0);
    /* One rank gets the whole first NUMA node; binding to it must succeed. */
    ASSERT_OK(tsr_topology_bind(t, &p));
    void *mem = NULL;
    bool bound = false;
    size_t bytes = 1 << 20;
    ASSERT_OK(tsr_topology_alloc(t, &p, bytes, &mem, &bound));
    memset(mem, 0x5a, bytes);
    ASSERT_EQ_INT(((unsigned char *)mem)[bytes - 1], 0x5a);
    fprintf(stderr, "  this machine: NUMA binding of the pool %s\n",
            bound ? "enforced" : "not available (unbound fallback)");
    tsr_topology_free(t, mem, bytes);
    tsr_topology_destroy(t);
}

TSR_TEST_MAIN(test_preinit_blacklists_plugins, test_counts, test_bad_specs, test_four_ranks_one_per_numa,
              test_eight_ranks_two_per_numa, test_two_ranks_spread_over_packages,
              test_more_ranks_than_cores, test_gpu_near_numa, test_this_machine_bind_and_alloc)
