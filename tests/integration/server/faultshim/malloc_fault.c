/*
 * malloc_fault: an LD_PRELOAD shim that makes malloc, calloc, realloc and
 * posix_memalign fail (NULL / ENOMEM) at a rate set at run time, for the
 * callers that report a failed allocation instead of dying: the Python
 * interpreter (MemoryError) and torch's CPU tensor allocator in libc10
 * (posix_memalign; a RuntimeError "DefaultCPUAllocator: can't allocate
 * memory").
 *
 * Why not libfiu's libc/mm/malloc (fiu-run -x): it fails every caller, and
 * two kinds of caller in this process end it on the first failure, by
 * design: Rust code (Hugging Face tokenizers) aborts ("memory allocation of
 * 8 bytes failed"), and C++ operator new inside torch code that cannot
 * throw calls std::terminate ("terminate called after throwing an instance
 * of 'std::bad_alloc'"). No server code can turn those into a 503; the
 * container restarts (docs/runbook.md). This shim leaves them alone so the
 * test measures what the server can do something about.
 *
 * Control: MALLOC_FAULT_CONTROL names a file holding 8 ASCII digits, the
 * failure rate in allocations per million ("00000000" = off). The file is
 * mapped shared, so a write by the test takes effect at once, with no
 * system call on the allocation path. MALLOC_FAULT_COUNT, when set, names a
 * file of 16 bytes where the shim counts the failures it injected.
 *
 * Build: cc -shared -fPIC -O2 -o malloc_fault.so malloc_fault.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *ptr, size_t size);
static int (*real_posix_memalign)(void **out, size_t alignment, size_t size);

#define RATE_DIGITS 8
#define MAX_CALLERS 64

static volatile const char *rate_text;   /* the mapped control file */
static volatile uint64_t *injected;      /* the mapped count file */
/* initial-exec: a preloaded library's TLS is static, and must not allocate on first use. */
static __thread uint64_t random_state __attribute__((tls_model("initial-exec")));
static __thread int inside __attribute__((tls_model("initial-exec"))); /* no fault in the shim's own calls */

/* Code ranges of the callers that may fail, cached by address. */
static uintptr_t allowed_start[MAX_CALLERS], allowed_end[MAX_CALLERS];
static uintptr_t refused_start[MAX_CALLERS], refused_end[MAX_CALLERS];
static volatile int allowed_count, refused_count;
static char cache_lock;

static void *map_file(const char *path, size_t size, int prot) {
    int fd = open(path, prot & PROT_WRITE ? O_RDWR : O_RDONLY);
    if (fd < 0) return NULL;
    void *mapped = mmap(NULL, size, prot, MAP_SHARED, fd, 0);
    close(fd);
    return mapped == MAP_FAILED ? NULL : mapped;
}

__attribute__((constructor)) static void malloc_fault_init(void) {
    const char *control = getenv("MALLOC_FAULT_CONTROL");
    const char *count = getenv("MALLOC_FAULT_COUNT");
    if (control) rate_text = map_file(control, RATE_DIGITS, PROT_READ);
    if (count) injected = map_file(count, sizeof(uint64_t), PROT_READ | PROT_WRITE);
    real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
}

static uint32_t rate_per_million(void) {
    volatile const char *text = rate_text;
    uint32_t rate = 0;
    if (!text) return 0;
    for (int i = 0; i < RATE_DIGITS; i++) {
        char c = text[i];
        if (c < '0' || c > '9') return 0;
        rate = rate * 10 + (uint32_t)(c - '0');
    }
    return rate;
}

static uint64_t next_random(void) {
    if (random_state == 0) random_state = ((uintptr_t)&random_state ^ ((uint64_t)getpid() << 32)) | 1;
    random_state ^= random_state << 13;
    random_state ^= random_state >> 7;
    random_state ^= random_state << 17;
    return random_state;
}

static int in_ranges(uintptr_t pc, const uintptr_t *start, const uintptr_t *end, int n) {
    for (int i = 0; i < n; i++)
        if (pc >= start[i] && pc < end[i]) return 1;
    return 0;
}

static int caller_may_fail(const void *caller) {
    uintptr_t pc = (uintptr_t)caller;
    if (in_ranges(pc, allowed_start, allowed_end, allowed_count)) return 1;
    if (in_ranges(pc, refused_start, refused_end, refused_count)) return 0;
    Dl_info info;
    if (!dladdr(caller, &info) || !info.dli_fname) return 0;
    const char *name = strrchr(info.dli_fname, '/');
    name = name ? name + 1 : info.dli_fname;
    int allowed = strncmp(name, "libpython", 9) == 0 || strncmp(name, "python", 6) == 0 ||
                  strncmp(name, "libc10.so", 9) == 0;
    /* Cache the page of the caller only: cheap, and good enough to skip most dladdr calls. */
    uintptr_t page = pc & ~(uintptr_t)4095;
    while (__atomic_test_and_set(&cache_lock, __ATOMIC_ACQUIRE)) {
    }
    if (allowed && allowed_count < MAX_CALLERS) {
        allowed_start[allowed_count] = page;
        allowed_end[allowed_count] = page + 4096;
        allowed_count++;
    } else if (!allowed && refused_count < MAX_CALLERS) {
        refused_start[refused_count] = page;
        refused_end[refused_count] = page + 4096;
        refused_count++;
    }
    __atomic_clear(&cache_lock, __ATOMIC_RELEASE);
    return allowed;
}

static int should_fail(const void *caller) {
    uint32_t rate = rate_per_million();
    if (rate == 0 || inside) return 0;
    if (next_random() % 1000000 >= rate) return 0;
    inside = 1;
    int fail = caller_may_fail(caller);
    inside = 0;
    if (fail && injected) __atomic_add_fetch(injected, 1, __ATOMIC_RELAXED);
    return fail;
}

void *malloc(size_t size) {
    if (should_fail(__builtin_return_address(0))) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_malloc(size);
}

void *calloc(size_t count, size_t size) {
    if (should_fail(__builtin_return_address(0))) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_calloc(count, size);
}

void *realloc(void *ptr, size_t size) {
    if (size != 0 && should_fail(__builtin_return_address(0))) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_realloc(ptr, size);
}

int posix_memalign(void **out, size_t alignment, size_t size) {
    if (should_fail(__builtin_return_address(0))) return ENOMEM;
    if (!real_posix_memalign) real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    return real_posix_memalign(out, alignment, size);
}
