/*
 * The sandbox ("pause") process of the local test image.
 *
 * Why our own: no registry is reachable from the test machines, and a pod
 * sandbox only needs a PID 1 that holds the namespaces open, reaps zombies
 * and exits cleanly when the runtime stops the sandbox. Built with
 * `gcc -static` so the image needs no libc.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stopping;

static void on_stop(int signo)
{
    (void)signo;
    stopping = 1;
}

static void reap(int signo)
{
    (void)signo;
    int saved = errno;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

static void install(int signo, void (*handler)(int))
{
    struct sigaction sa = {0};
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(signo, &sa, NULL) < 0) {
        perror("sigaction");
        exit(1);
    }
}

int main(void)
{
    install(SIGTERM, on_stop);
    install(SIGINT, on_stop);
    install(SIGCHLD, reap);
    while (!stopping) {
        pause();
    }
    reap(SIGCHLD);
    return 0;
}
