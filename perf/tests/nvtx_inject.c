/* An NVTX injection library standing in for Nsight Systems in `perf/tests/perf.rs`: NVTX
 * loads it from NVTX_INJECTION64_PATH at a process's first NVTX call, as it loads Nsight's,
 * and it writes every domain range start and end to NVTX_TEST_LOG.<pid>, one a line:
 *
 *     start ID DOMAIN MESSAGE
 *     end ID
 *
 * The types and numbers are NVTX 3's ABI (nvtxDetail/nvtxTypes.h, nvToolsExt.h): the export
 * table of callbacks, the CORE2 module's callback ids and nvtxEventAttributes_v2. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <wchar.h>

typedef void (*FunctionPointer)(void);
typedef FunctionPointer **FunctionTable;
typedef const void *(*GetExportTable)(uint32_t id);
typedef struct {
    size_t struct_size;
    int (*GetModuleFunctionTable)(int module, FunctionTable *out_table, unsigned int *out_size);
} ExportTableCallbacks;

enum { ETID_CALLBACKS = 1, MODULE_CORE2 = 5 };
enum {
    CORE2_RANGE_START = 2,
    CORE2_RANGE_END = 3,
    CORE2_REGISTER_STRING_A = 10,
    CORE2_REGISTER_STRING_W = 11,
    CORE2_DOMAIN_CREATE_A = 12,
    CORE2_DOMAIN_CREATE_W = 13,
};
enum { MESSAGE_ASCII = 1, MESSAGE_UNICODE = 2, MESSAGE_REGISTERED = 3 };

typedef struct {
    uint16_t version;
    uint16_t size;
    uint32_t category;
    int32_t color_type;
    uint32_t color;
    int32_t payload_type;
    int32_t reserved0;
    uint64_t payload;
    int32_t message_type;
    const void *message;
} EventAttributes;

/* A domain handle and a registered string handle are pointers to their names here. */
static FILE *out;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_id = 1;

static char *narrow(const wchar_t *w) {
    char text[512] = "";
    if (w) snprintf(text, sizeof text, "%ls", w);
    return strdup(text);
}
static void *domain_create_a(const char *name) { return strdup(name ? name : "(default)"); }
static void *domain_create_w(const wchar_t *name) { return narrow(name); }
static void *register_string_a(void *domain, const char *s) { (void)domain; return strdup(s ? s : ""); }
static void *register_string_w(void *domain, const wchar_t *s) { (void)domain; return narrow(s); }

static uint64_t range_start(void *domain, const EventAttributes *a) {
    char text[512] = "";
    if (a && a->message) {
        if (a->message_type == MESSAGE_ASCII || a->message_type == MESSAGE_REGISTERED)
            snprintf(text, sizeof text, "%s", (const char *)a->message);
        else if (a->message_type == MESSAGE_UNICODE)
            snprintf(text, sizeof text, "%ls", (const wchar_t *)a->message);
    }
    pthread_mutex_lock(&lock);
    uint64_t id = next_id++;
    fprintf(out, "start %llu %s %s\n", (unsigned long long)id, domain ? (const char *)domain : "(default)", text);
    fflush(out);
    pthread_mutex_unlock(&lock);
    return id;
}

static void range_end(void *domain, uint64_t id) {
    (void)domain;
    pthread_mutex_lock(&lock);
    fprintf(out, "end %llu\n", (unsigned long long)id);
    fflush(out);
    pthread_mutex_unlock(&lock);
}

int InitializeInjectionNvtx2(GetExportTable get) {
    const char *log = getenv("NVTX_TEST_LOG");
    char path[4096];
    if (!log || snprintf(path, sizeof path, "%s.%d", log, (int)getpid()) >= (int)sizeof path) return 0;
    if (!(out = fopen(path, "w"))) return 0;
    const ExportTableCallbacks *cb = get(ETID_CALLBACKS);
    FunctionTable table = 0;
    unsigned int size = 0;
    /* `size` is the highest callback id the table holds (NVTX writes its entry count less one). */
    if (!cb || !cb->GetModuleFunctionTable(MODULE_CORE2, &table, &size) || size < CORE2_DOMAIN_CREATE_W) return 0;
    *table[CORE2_RANGE_START] = (FunctionPointer)range_start;
    *table[CORE2_RANGE_END] = (FunctionPointer)range_end;
    *table[CORE2_REGISTER_STRING_A] = (FunctionPointer)register_string_a;
    *table[CORE2_REGISTER_STRING_W] = (FunctionPointer)register_string_w;
    *table[CORE2_DOMAIN_CREATE_A] = (FunctionPointer)domain_create_a;
    *table[CORE2_DOMAIN_CREATE_W] = (FunctionPointer)domain_create_w;
    return 1;
}
