/*
 * hvdps: make TensorFlow's gRPC server listen on one address instead of all.
 *
 * TensorFlow's GrpcServer hard-codes "0.0.0.0:<port>" (gRPC turns that into a
 * dual-stack wildcard, *:<port>), and its gRPC runtime has no authentication:
 * anyone who reaches the port can read or overwrite the model. Preloaded into
 * a PS/worker task, this replaces a bind() of the wildcard address to port
 * HVDPS_BIND_PORT with a bind() to HVDPS_BIND_ADDR (an IPv4 or IPv6 literal).
 * HVDPS_BIND_PORT=any does it for every port: a local mpirun (whose PMIx tool
 * listener ignores every interface setting) and everything it starts. An
 * IPv6-only socket cannot take an IPv4 address; for a loopback address it
 * gets ::1 instead. Every other bind() is passed through untouched.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

static int port_matches(int port) {
    const char *p = getenv("HVDPS_BIND_PORT");
    if (!p) return 0;
    return strcmp(p, "any") == 0 || atoi(p) == port;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind;
    if (!real_bind) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    const char *want = getenv("HVDPS_BIND_ADDR");
    if (!want || !addr) return real_bind(fd, addr, len);
    struct in_addr v4;
    struct in6_addr v6;
    int is_v4 = inet_pton(AF_INET, want, &v4) == 1;
    int is_v6 = !is_v4 && inet_pton(AF_INET6, want, &v6) == 1;

    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in a;
        memcpy(&a, addr, sizeof a);
        if (a.sin_addr.s_addr == htonl(INADDR_ANY) && port_matches(ntohs(a.sin_port)) && is_v4) {
            a.sin_addr = v4;
            return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
        }
    } else if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a;
        memcpy(&a, addr, sizeof a);
        if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr) && port_matches(ntohs(a.sin6_port)) && (is_v4 || is_v6)) {
            if (is_v6) {
                a.sin6_addr = v6;
                return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
            }
            /* an IPv4 address on a dual-stack socket (gRPC's): its v4-mapped form */
            memset(&a.sin6_addr, 0, sizeof a.sin6_addr);
            a.sin6_addr.s6_addr[10] = 0xff;
            a.sin6_addr.s6_addr[11] = 0xff;
            memcpy(&a.sin6_addr.s6_addr[12], &v4, 4);
            int rc = real_bind(fd, (const struct sockaddr *)&a, sizeof a);
            if (rc == 0 || (ntohl(v4.s_addr) >> 24) != 127) return rc;
            a.sin6_addr = in6addr_loopback;   /* an IPv6-only socket: loopback is ::1 */
            return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
        }
    }
    return real_bind(fd, addr, len);
}
