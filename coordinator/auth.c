/* SPDX-License-Identifier: MIT
 *
 * Peer identity: SO_PEERCRED, munge credentials, the admin group.
 */
#include "config.h"

#include <grp.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/cred.h"
#include "common/mem.h"
#include "coordinator/auth.h"

int dt_auth_peercred(uv_stream_t *s, uid_t *uid, gid_t *gid, pid_t *pid)
{
    uv_os_fd_t fd;
    struct ucred cr;
    socklen_t len = sizeof(cr);

    if (uv_fileno((uv_handle_t *)s, &fd) < 0)
        return DT_EINVAL;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
        return dt_err_errno(errno);
    *uid = cr.uid;
    *gid = cr.gid;
    if (pid)
        *pid = cr.pid;
    return 0;
}

int dt_auth_munge(const char *cred, const char *munge_socket, uid_t *uid, gid_t *gid,
                  dt_emsg_t *em)
{
    return dt_cred_check(cred, munge_socket, "coordinator", uid, gid, em);
}

bool dt_auth_is_admin(uid_t uid, gid_t gid, const char *admin_group)
{
    struct group *gr;
    struct passwd *pw;
    bool yes = false;

    if (uid == 0)
        return true;
    if (admin_group == NULL || *admin_group == '\0' || (gr = getgrnam(admin_group)) == NULL)
        return false;
    if (gid == gr->gr_gid)
        return true;
    gid_t want = gr->gr_gid;
    if ((pw = getpwuid(uid)) == NULL)
        return false;
    int n = 64;
    gid_t *groups = dt_xmallocarray((size_t)n, sizeof(gid_t));
    if (getgrouplist(pw->pw_name, pw->pw_gid, groups, &n) < 0) {
        groups = dt_xrealloc(groups, (size_t)n * sizeof(gid_t));
        getgrouplist(pw->pw_name, pw->pw_gid, groups, &n);
    }
    for (int i = 0; i < n; i++)
        if (groups[i] == want)
            yes = true;
    free(groups);
    return yes;
}
