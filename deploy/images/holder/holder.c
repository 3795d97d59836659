/*
 * cdi-holder: the command of a node-pull importer pod's "server" container.
 *
 * With `pullMethod: node` the kubelet pulls the tenant's containerDisk image and runs it as a
 * side container of the importer pod. Such an image is usually FROM scratch: no shell, no
 * interpreter, nothing of ours. So its command is this static binary, which an init container
 * copied from the importer image into the shared emptyDir /shared. It only has to keep the
 * container (and so its root filesystem) alive while the importer, which shares the pod's
 * process namespace, reads the one file under /proc/<our pid>/root/disk/:
 *
 *   1. write our pid to /shared/ready (written to a temporary name, then renamed: the importer
 *      never reads a partial pid);
 *   2. wait until /shared/done exists (the importer's last act), or until the importer's lock
 *      /shared/importer.lock can be taken (the kernel releases it when the importer dies, even
 *      by SIGKILL or the OOM killer, so the pod always ends);
 *   3. exit 0. SIGTERM also ends it with 0 (pod deletion).
 *
 * Static (cc -static -Os): a dynamically linked binary would load the tenant image's ld.so and
 * libc, i.e. run tenant code next to the importer. No libc features beyond a few syscalls.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#ifndef SHARED_DIR
#define SHARED_DIR "/shared"
#endif

static volatile sig_atomic_t stop;

static void on_term(int sig) {
    (void)sig;
    stop = 1;
}

static int write_ready(void) {
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    int fd = open(SHARED_DIR "/ready.tmp", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    if (write(fd, pid, (size_t)len) != len || fsync(fd) != 0) {
        close(fd);
        return -1;
    }
    close(fd);
    return rename(SHARED_DIR "/ready.tmp", SHARED_DIR "/ready");
}

/* 1 once the importer is gone: its lock file exists and nobody holds the lock. */
static int importer_gone(int *lock_fd) {
    if (*lock_fd < 0)
        *lock_fd = open(SHARED_DIR "/importer.lock", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    return *lock_fd >= 0 && flock(*lock_fd, LOCK_EX | LOCK_NB) == 0;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    if (write_ready() != 0) {
        perror("cdi-holder: cannot write " SHARED_DIR "/ready");
        return 1;
    }
    int lock_fd = -1;
    const struct timespec tick = {0, 200 * 1000 * 1000};
    while (!stop && access(SHARED_DIR "/done", F_OK) != 0 && !importer_gone(&lock_fd))
        nanosleep(&tick, NULL);
    return 0;
}
