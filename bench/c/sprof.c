// A wall-clock sampling profiler of one thread, for machines without perf or gdb: a
// per-thread timer sends SIGPROF, and the handler records backtrace(). Where the decoding
// thread spends a step on a GPU (the host side of a decode) was measured with it.
//   gcc -O2 -shared -fPIC -o build/libsprof.so bench/c/sprof.c -lrt
// From Python: ctypes.CDLL("build/libsprof.so").sprof_start(2000) on the thread to sample,
// then sprof_stop(b"samples.txt"). A program: env SPROF_AUTO=1 SPROF_OUT=samples.txt
// [SPROF_HZ=2000] LD_PRELOAD=build/libsprof.so PROGRAM samples its main thread until exit.
// Output: a line a sample, frames "library offset|", leaf first; bench/sprof_report.py
// names them (addr2line) and sums them by class and function.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAXS 300000
#define DEPTH 40
static void * buf[MAXS][DEPTH];
static unsigned char depth[MAXS];
static atomic_int n;
static timer_t tmr;
static volatile int on;

static void handler(int sig, siginfo_t * si, void * uc) {
    (void) sig; (void) si; (void) uc;
    if (!on) return;
    int i = atomic_fetch_add(&n, 1);
    if (i >= MAXS) return;
    int e = errno;
    depth[i] = (unsigned char) backtrace(buf[i], DEPTH);
    errno = e;
}

int sprof_start(int hz) {
    void * t[4];
    backtrace(t, 4);  // loads the unwinder outside the handler
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGPROF, &sa, NULL);
    struct sigevent sev;
    memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev._sigev_un._tid = (pid_t) syscall(SYS_gettid);
    sev.sigev_signo = SIGPROF;
    if (timer_create(CLOCK_MONOTONIC, &sev, &tmr) != 0) return -1;
    long ns = 1000000000L / hz;
    struct itimerspec its = {{ns / 1000000000L, ns % 1000000000L}, {ns / 1000000000L, ns % 1000000000L}};
    atomic_store(&n, 0);
    on = 1;
    return timer_settime(tmr, 0, &its, NULL);
}

int sprof_stop(const char * path) {
    on = 0;
    timer_delete(tmr);
    FILE * f = fopen(path, "w");
    if (!f) return -1;
    int m = atomic_load(&n);
    if (m > MAXS) m = MAXS;
    for (int i = 0; i < m; ++i) {
        for (int d = 0; d < depth[i]; ++d) {
            Dl_info info;
            if (dladdr(buf[i][d], &info) && info.dli_fname) {
                fprintf(f, "%s %lx|", info.dli_fname, (unsigned long) ((char *) buf[i][d] - (char *) info.dli_fbase) - (d ? 1 : 0));
            } else {
                fprintf(f, "? %lx|", (unsigned long) buf[i][d]);
            }
        }
        fputc('\n', f);
    }
    fclose(f);
    return m;
}

__attribute__((constructor)) static void sprof_init(void) {
    const char * out = getenv("SPROF_OUT");
    if (out && getenv("SPROF_AUTO")) sprof_start(getenv("SPROF_HZ") ? atoi(getenv("SPROF_HZ")) : 2000);
}

__attribute__((destructor)) static void sprof_fini(void) {
    const char * out = getenv("SPROF_OUT");
    if (out && getenv("SPROF_AUTO")) sprof_stop(out);
}
