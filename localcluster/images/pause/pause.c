/*
 * The pod sandbox's only process. It holds the pod's namespaces open for the
 * pod's lifetime, so it must do nothing and cost nothing: sleep until a
 * signal arrives, reap any orphaned child re-parented to it (it is PID 1 of
 * the pod when the pod shares its process namespace), and exit cleanly on
 * SIGTERM or SIGINT so the kubelet's stop is immediate.
 *
 * Linked statically so the image is this one file; it needs no privilege and
 * runs as whatever user the pod's security context names.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signal_number) {
    (void)signal_number;
    _exit(0);
}

static void reap(int signal_number) {
    (void)signal_number;
    int saved_errno = errno;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved_errno;
}

static int handle(int signal_number, void (*handler)(int), int flags) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = handler;
    action.sa_flags = flags;
    sigemptyset(&action.sa_mask);
    return sigaction(signal_number, &action, NULL);
}

int main(void) {
    if (handle(SIGTERM, stop, 0) != 0 || handle(SIGINT, stop, 0) != 0 ||
        handle(SIGCHLD, reap, SA_NOCLDSTOP | SA_RESTART) != 0) {
        return 1;
    }
    for (;;) {
        pause();
    }
}
