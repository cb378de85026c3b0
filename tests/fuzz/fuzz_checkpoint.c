/* libFuzzer target: the checkpoint reader of `tessera run` (jobs/run/checkpoint.c,
 * tsr_ckpt_read). Mutating an HDF5 file's raw bytes would mostly fuzz HDF5's own parser
 * (not instrumented, and not tessera's to fix: a 20 s run already hits a 10^19-byte
 * malloc inside it). So the input is a script of edits that HDF5 itself applies to a valid
 * checkpoint (tests/fuzz/fuzz_ckpt_base.h, written at start-up by tsr_ckpt_write): every
 * attribute and dataset of that file is an item, and each edit is
 *   [op][item] then, by op % 3,
 *   0 patch:  [offset][n-1 (0..7)][n bytes]  overwrite n bytes of the value at offset
 *   1 delete:                               remove the attribute or dataset
 *   2 resize: [d0][d1][fill]                a dataset again with d0 rows (d1 columns when
 *                                           2-D or 3-D, the last dim kept when 3-D: the KV
 *                                           pools), same type, bytes `fill`; an attribute
 *                                           again as a d0-byte string
 * (at most 16 edits). What the reader then does with the file is what is tested: every
 * value it trusts, every size it allocates from, read whole and as one rank's part (layer 1,
 * KV head 1: a part read alone never matches the whole file's checksum, so it is refused
 * at the end, after every allocation and read it makes). The unedited file must read back. */
#include "tests/fuzz/fuzz_util.h"

#ifdef TSR_HAVE_HDF5

#include <hdf5.h>

#include "tests/fuzz/fuzz_ckpt_base.h"

#define TSR__MAX_ITEMS 256

typedef struct tsr__item {
    char obj[128];  /* path from the root ("." for the root group) */
    char attr[64];  /* "" for a dataset */
} tsr__item;

static tsr__item tsr__items[TSR__MAX_ITEMS];
static int tsr__n_items;
static uint8_t *tsr__base;
static size_t tsr__base_len;

static tsr__item *tsr__add(const char *obj, const char *attr) {
    if (tsr__n_items == TSR__MAX_ITEMS || strlen(obj) >= sizeof tsr__items[0].obj ||
        strlen(attr) >= sizeof tsr__items[0].attr)
        return NULL;
    tsr__item *it = &tsr__items[tsr__n_items++];
    strcpy(it->obj, obj);
    strcpy(it->attr, attr);
    return it;
}

static herr_t tsr__attr_cb(hid_t loc, const char *name, const H5A_info_t *info, void *obj) {
    (void)loc;
    (void)info;
    tsr__add(obj, name);
    return 0;
}

static herr_t tsr__obj_cb(hid_t root, const char *name, const H5O_info_t *info, void *data) {
    (void)data;
    if (info->type == H5O_TYPE_DATASET) tsr__add(name, "");
    hid_t o = H5Oopen(root, name, H5P_DEFAULT);
    if (o >= 0) {
        H5Aiterate2(o, H5_INDEX_NAME, H5_ITER_INC, NULL, tsr__attr_cb, (void *)name);
        H5Oclose(o);
    }
    return 0;
}

/* Writes the base checkpoint, keeps its bytes and lists its items (once per process). */
static void tsr__init(void) {
    const char *dir = tsr_fuzz_dir();
    char path[600];
    snprintf(path, sizeof path, "%s/ckpt.h5", dir);
    if (tsr_fuzz_ckpt_write_base(path) != TSR_OK) {
        fprintf(stderr, "fuzz_checkpoint: base checkpoint: %s\n", tsr_last_error());
        abort();
    }
    FILE *f = fopen(path, "rb");
    if (!f || fseek(f, 0, SEEK_END) || (tsr__base_len = (size_t)ftell(f)) == 0 ||
        fseek(f, 0, SEEK_SET) || !(tsr__base = malloc(tsr__base_len)) ||
        fread(tsr__base, 1, tsr__base_len, f) != tsr__base_len)
        abort();
    fclose(f);
    hid_t h = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (h < 0 || H5Ovisit2(h, H5_INDEX_NAME, H5_ITER_INC, tsr__obj_cb, NULL,
                           H5O_INFO_BASIC) < 0)
        abort();
    H5Fclose(h);
    if (tsr__n_items == 0) abort();
}

typedef struct tsr__in {
    const uint8_t *p;
    size_t n;
} tsr__in;

static uint8_t tsr__byte(tsr__in *in) {
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

/* Reads the whole value (storage type, as a memory type of this machine) into a buffer. */
static void tsr__patch(hid_t f, const tsr__item *it, tsr__in *in) {
    size_t off = tsr__byte(in), n = (size_t)(tsr__byte(in) & 7) + 1;
    uint8_t bytes[8];
    for (size_t i = 0; i < n; i++) bytes[i] = tsr__byte(in);
    bool is_attr = it->attr[0] != 0;
    hid_t o = is_attr ? H5Aopen_by_name(f, it->obj, it->attr, H5P_DEFAULT, H5P_DEFAULT)
                      : H5Dopen2(f, it->obj, H5P_DEFAULT);
    if (o < 0) return;
    hid_t t = is_attr ? H5Aget_type(o) : H5Dget_type(o);
    hid_t sp = is_attr ? H5Aget_space(o) : H5Dget_space(o);
    hssize_t pts = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
    size_t esz = t >= 0 ? H5Tget_size(t) : 0, size = pts > 0 ? (size_t)pts * esz : 0;
    uint8_t *buf = size ? malloc(size) : NULL;
    if (buf && (is_attr ? H5Aread(o, t, buf) : H5Dread(o, t, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                                        buf)) >= 0) {
        for (size_t i = 0; i < n; i++) buf[(off + i) % size] = bytes[i];
        if (is_attr) H5Awrite(o, t, buf);
        else H5Dwrite(o, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
    }
    free(buf);
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    if (is_attr) H5Aclose(o);
    else H5Dclose(o);
}

static void tsr__delete(hid_t f, const tsr__item *it) {
    if (it->attr[0]) H5Adelete_by_name(f, it->obj, it->attr, H5P_DEFAULT);
    else H5Ldelete(f, it->obj, H5P_DEFAULT);
}

static void tsr__resize(hid_t f, const tsr__item *it, tsr__in *in) {
    hsize_t dims[3] = {tsr__byte(in), tsr__byte(in), 0};
    uint8_t fill = tsr__byte(in);
    if (it->attr[0]) { /* a string of d0 bytes in place of the attribute */
        H5Adelete_by_name(f, it->obj, it->attr, H5P_DEFAULT);
        hid_t o = H5Oopen(f, it->obj, H5P_DEFAULT);
        hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR);
        char s[256];
        memset(s, fill, sizeof s);
        if (o >= 0 && t >= 0 && sp >= 0 && H5Tset_size(t, dims[0] ? dims[0] : 1) >= 0) {
            hid_t a = H5Acreate2(o, it->attr, t, sp, H5P_DEFAULT, H5P_DEFAULT);
            if (a >= 0) {
                H5Awrite(a, t, s);
                H5Aclose(a);
            }
        }
        if (sp >= 0) H5Sclose(sp);
        if (t >= 0) H5Tclose(t);
        if (o >= 0) H5Oclose(o);
        return;
    }
    hid_t d = H5Dopen2(f, it->obj, H5P_DEFAULT);
    if (d < 0) return;
    hid_t t = H5Dget_type(d), sp = H5Dget_space(d);
    int rank = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    hsize_t old[3] = {0, 0, 0};
    if (rank == 3 && H5Sget_simple_extent_dims(sp, old, NULL) >= 0) dims[2] = old[2];
    H5Dclose(d);
    if (sp >= 0) H5Sclose(sp);
    if (t < 0 || rank < 1 || rank > 3) {
        if (t >= 0) H5Tclose(t);
        return;
    }
    H5Ldelete(f, it->obj, H5P_DEFAULT);
    size_t size = (size_t)dims[0] * (rank >= 2 ? (size_t)dims[1] : 1) *
                  (rank == 3 ? (size_t)dims[2] : 1) * H5Tget_size(t);
    uint8_t *buf = malloc(size ? size : 1);
    hid_t nsp = H5Screate_simple(rank, dims, NULL);
    if (buf && nsp >= 0) {
        memset(buf, fill, size);
        hid_t nd = H5Dcreate2(f, it->obj, t, nsp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (nd >= 0) {
            if (size) H5Dwrite(nd, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
            H5Dclose(nd);
        }
    }
    if (nsp >= 0) H5Sclose(nsp);
    free(buf);
    H5Tclose(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tsr__base) tsr__init();
    const char *path = tsr_fuzz_write("ckpt.h5", tsr__base, tsr__base_len);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) abort();
    tsr__in in = {data, size};
    for (int e = 0; e < 16 && in.n >= 2; e++) {
        uint8_t op = tsr__byte(&in);
        const tsr__item *it = &tsr__items[tsr__byte(&in) % tsr__n_items];
        switch (op % 3) {
        case 0: tsr__patch(f, it, &in); break;
        case 1: tsr__delete(f, it); break;
        default: tsr__resize(f, it, &in); break;
        }
    }
    H5Fclose(f);
    tsr_ckpt c;
    tsr_status st = tsr_ckpt_read(path, &c);
    if (size < 2 && st != TSR_OK) { /* no edit: the writer's own file must read back */
        fprintf(stderr, "fuzz_checkpoint: unedited checkpoint refused: %s\n", tsr_last_error());
        abort();
    }
    if (st == TSR_OK) {
        (void)tsr_ckpt_check(path, &c.meta, &c.meta);
        tsr_ckpt_free(&c);
    }
    tsr_ckpt_part part = {.layer_begin = 1, .layer_end = 2, .kv_head_begin = 1,
                          .kv_head_end = 2, .head_owner = true};
    if (tsr_ckpt_read_part(path, &part, &c) == TSR_OK) abort(); /* cannot match alone */
    return 0;
}

#else /* no HDF5 in this build: nothing to read */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)data;
    (void)size;
    return 0;
}

#endif
