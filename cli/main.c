/* SPDX-License-Identifier: MIT
 *
 * dtctl: plan, submit and control dt jobs. Global options, then the table
 * of subcommands (one file each).
 */
#include "config.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/dtctl.h"
#include "common/log.h"
#include "common/text.h"

static const struct command {
    const char *name;
    int (*fn)(dtctl_t *ctl, int argc, char **argv);
    const char *args;
    const char *summary;
} commands[] = {
    { "plan", dtctl_plan, "--tokens N --model M --gpu G [...]",
      "plan a job: ranks, memory, time (no coordinator needed)" },
    { "submit", dtctl_submit, "SPECFILE | --kind K --model M --tokens N [...]",
      "submit a job; prints its id" },
    { "list", dtctl_list, "", "list jobs (yours; all for admins)" },
    { "show", dtctl_show, "JOB", "a job's state, plan, agents and progress" },
    { "cancel", dtctl_cancel, "JOB [--reason TEXT] [--checkpoint]",
      "cancel a job (--checkpoint: after a checkpoint)" },
    { "events", dtctl_events, "JOB [--since ID]", "a job's event history" },
    { "checkpoints", dtctl_checkpoints, "JOB", "a job's checkpoints" },
    { "checkpoint", dtctl_checkpoint, "JOB", "ask a running job for a checkpoint now" },
    { "resume", dtctl_resume, "JOB",
      "run a failed or cancelled job again from its newest committed checkpoint" },
    { "watch", dtctl_watch, "JOB [--interval DUR]", "a job's live progress until it ends" },
    { "logs", dtctl_logs, "JOB [--rank N] [-f]", "a job's output: a rank's log, or all" },
    { "plot", dtctl_plot, "JOB --svg FILE [--state-dir DIR]",
      "a picture of a job: loss, tokens/s, failures and their cost, checkpoints" },
    { "run", dtctl_run, "--local [SPECFILE] [options]",
      "run a job on this machine: private coordinator and agents" },
    { "nll", dtctl_nll, "DIR [--out FILE.npy]",
      "a prefill's perplexity by position, from its --out-dir (local)" },
    { "export", dtctl_export, "SRC --hf DIR [--dtype D] [--shard-size S]",
      "a training checkpoint's parameters as a Hugging Face model directory" },
};

static void usage(FILE *f)
{
    fprintf(f, "usage: dtctl [--socket PATH | --coord HOST:PORT [--munge-socket PATH]] [--json]\n"
               "             COMMAND [ARGS]\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %-12s %-44s %s\n", commands[i].name, commands[i].args, commands[i].summary);
    fprintf(f, "\nThe coordinator is reached at --socket, $DT_SOCKET, or %s;\n"
               "--coord (or $DT_COORD) uses TCP with a munge credential. See dtctl(1).\n",
            DT_LOCALSTATEDIR "/lib/dt/dtcoordd.sock");
}

int main(int argc, char **argv)
{
    dtctl_t ctl = { .prog = "dtctl" };
    static const struct option lo[] = {
        { "socket", required_argument, NULL, 's' },
        { "coord", required_argument, NULL, 'c' },
        { "json", no_argument, NULL, 'j' },
        { "munge-socket", required_argument, NULL, 'm' },
        { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, 'V' },
        { NULL, 0, NULL, 0 },
    };
    int c;

    dt_log_init("dtctl", DT_LOG_WARN);
    /* global options stop at the first non-option: the subcommand */
    while ((c = getopt_long(argc, argv, "+h", lo, NULL)) != -1) {
        switch (c) {
        case 's': ctl.socket = optarg; break;
        case 'c': ctl.coord = optarg; break;
        case 'j': ctl.json = 1; break;
        case 'm': ctl.munge_socket = optarg; break;
        case 'h': usage(stdout); return DTCTL_OK;
        case 'V': printf("dtctl %s\n", PACKAGE_VERSION); return DTCTL_OK;
        default: usage(stderr); return DTCTL_USAGE;
        }
    }
    int from_env = 0;
    if (ctl.coord == NULL && getenv("DT_COORD") && *getenv("DT_COORD") && ctl.socket == NULL) {
        ctl.coord = getenv("DT_COORD");
        from_env = 1;
    }
    if (ctl.coord) { /* bad usage, told now rather than after a failed connect */
        char host[256], port[6];
        dt_emsg_t em = { "" };
        if (dtctl_parse_coord(ctl.coord, host, sizeof(host), port, &em) < 0) {
            char *e = dt_text_escape(em.s, 0);
            fprintf(stderr, "dtctl: %s %s\n", from_env ? "DT_COORD" : "--coord", e);
            free(e);
            usage(stderr);
            return DTCTL_USAGE;
        }
    }
    if (optind >= argc) {
        usage(stderr);
        return DTCTL_USAGE;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(argv[optind], commands[i].name) == 0) {
            int sub_argc = argc - optind;
            char **sub_argv = argv + optind;
            optind = 0; /* full getopt reset: each subcommand parses its own options */
            return commands[i].fn(&ctl, sub_argc, sub_argv);
        }
    fprintf(stderr, "dtctl: unknown command '%s'\n", argv[optind]);
    usage(stderr);
    return DTCTL_USAGE;
}
