/* SPDX-License-Identifier: MIT
 *
 * dtctl run --local: the embedded default. One command runs a job on this
 * machine with nothing else installed or running: a private dtcoordd on a
 * state directory of the user's (database, socket, logs), the job submitted
 * to it, N local dtagentd (each running M dtengine workers; K more agents as
 * hot spares), the live display of `dtctl watch`, and the result. On request
 * it injects one failure (a worker killed or stopped, an agent killed, the
 * coordinator killed and restarted) to show the job recover.
 *
 * This file is the flow: options, the spec, submitting, and the order of
 * things. It wires the local supervisor (cli/run_super.h: the processes,
 * the state directory, the teardown) and the fault injector
 * (cli/run_inject.h), which know nothing of each other: the supervisor
 * hands each SHOW reply to the injector's hook, and the injector acts
 * through the supervisor's kill functions it is given.
 *
 * Not here: Slurm (dtctl submit), keeping the job running after dtctl exits.
 */
#include "config.h"

#include <getopt.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "cli/dtctl.h"
#include "io/hfspec.h"
#include "cli/run_inject.h"
#include "cli/run_super.h"
#include "common/conf.h"
#include "common/mem.h"
#include "common/proto.h"
#include "common/wire.h"
#include "spec/model.h"
#include "spec/spec.h"

/* The job without a SPECFILE: a tiny LLaMA-style model learns a generated
 * long-context recall task (key-value pairs planted in the sequence,
 * queried at its end) over a ring of 4 CPU ranks on 2 agents, so its
 * accuracy shows attention working across rank boundaries. */
static const char default_spec[] =
    "# dtctl run --local: the default job (dt-spec(5)). A 2-layer LLaMA-3\n"
    "# shape on the recall task, 1024 tokens over a ring of 4 CPU ranks on 2\n"
    "# agents: the pairs sit on other ranks than the queries, so recall above\n"
    "# chance (1/16) needs attention across rank boundaries. About 4 minutes\n"
    "# on 2 cores. RoPE base 10000 and a tied head, written out: custom\n"
    "# alone means 500000 and untied (dt-spec(5)).\n"
    "name = local-recall\n"
    "kind = train\n"
    "model = custom\n"
    "dim = 128\n"
    "layers = 2\n"
    "heads = 4\n"
    "kv_heads = 2\n"
    "ffn = 384\n"
    "rope_theta = 10000\n"
    "tied = yes\n"
    "vocab = 512\n"
    "data = recall\n"
    "tokens = 1024\n"
    "batch = 2\n"
    "steps = 600\n"
    "seed = 1\n"
    "ranks = 4\n"
    "nodes = 2\n"
    "gpus_per_node = 2\n"
    "gpu = cpu\n"
    "ckpt_every = 100\n"
    "recall_keys = 16\n"
    "recall_values = 16\n"
    "recall_pairs = 4\n"
    "recall_queries = 4\n";


/* ---- the job -------------------------------------------------------------------- */

typedef struct opts {
    const char *spec_file, *state_dir, *steps, *inject, *device, *dtype;
    int agents, workers, spares; /* -1: not given */
    int64_t interval_ms, hang_ms;
    int local, json, print_spec;
} opts_t;

static int set_int(dt_spec_t *s, const char *key, long long v, dt_emsg_t *em)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%lld", v);
    return dt_spec_set(s, key, buf, em);
}

/* The spec: SPECFILE or the default, with the options applied, checked.
 * The agents: M workers each (--workers, else the spec's gpus_per_node,
 * else 2); N agents (--agents, else enough for the spec's ranks, else 2);
 * the ranks are N*M when --agents or --workers is given or the spec has
 * none; K spare agents (--spares, else the spec's spares over M). The spec
 * then says nodes = N+K, gpus_per_node = M, spares = K*M, so that the
 * planner places the ranks on these agents. With dp = D rings the spec's
 * ranks are per ring: the agents hold D of them (D * ranks workers), and
 * N*M slots make rings of N*M / D ranks (D must divide N*M; without
 * --agents, N grows until it does). */
/* What a job's ranks count as steps in their progress: training steps,
 * prefill's layers, attn's one call. */
static long long job_steps(const dt_spec_t *s)
{
    dt_model_cfg_t m;

    if (strcmp(s->kind, "train") == 0)
        return dt_spec_int(s, "steps");
    if (strcmp(s->kind, "prefill") == 0 && dt_model_from_spec(s, &m, NULL) == 0)
        return m.layers;
    return 1;
}

static int make_spec(dtctl_super_t *sup, const opts_t *o, dt_spec_t *s, dt_emsg_t *em)
{
    int rc;
    long long ranks, dp;

    if (o->spec_file)
        rc = dt_spec_load(o->spec_file, s, em);
    else
        rc = dt_spec_parse("the default spec", default_spec, s, em);
    if (rc < 0)
        return rc;
    if (o->steps && (rc = dt_spec_set(s, "steps", o->steps, em)) < 0)
        return rc;
    if (o->device) {
        int cuda = strcmp(o->device, "cuda") == 0;
        if ((rc = dt_spec_set(s, "device", o->device, em)) < 0)
            return rc;
        /* the cluster preset follows the device: a GPU job plans on the
         * default GPU preset where the spec named the CPU's, and back */
        if (cuda && s->gpu && strcmp(s->gpu, "cpu") == 0 &&
            (rc = dt_spec_set(s, "gpu", "h100-sxm", em)) < 0)
            return rc;
        if (!cuda && s->gpu && strcmp(s->gpu, "cpu") != 0 &&
            (rc = dt_spec_set(s, "gpu", "cpu", em)) < 0)
            return rc;
        /* the built-in job's 4 heads of 32 become 2 heads of 64 on GPUs,
         * the smallest head the CUDA attention kernels take */
        if (cuda && !o->spec_file &&
            ((rc = dt_spec_set(s, "heads", "2", em)) < 0 ||
             (rc = dt_spec_set(s, "kv_heads", "1", em)) < 0))
            return rc;
    }
    if (o->dtype && (rc = dt_spec_set(s, "dtype", o->dtype, em)) < 0)
        return rc;
    sup->workers = o->workers > 0           ? o->workers
                   : s->gpus_per_node > 0 ? (int)s->gpus_per_node
                                          : 2;
    dp = s->dp > 1 ? s->dp : 1;
    if (o->agents > 0) {
        sup->nagents = o->agents;
    } else if (s->ranks > 0) {
        long long n = (dp * s->ranks + sup->workers - 1) / sup->workers;
        if (n > DTCTL_MAX_AGENTS)
            return dt_emsg_set(em, DT_EINVAL, "%lld ranks (dp %lld x ranks %lld) need %lld agents "
                               "of %d workers: at most %d", dp * s->ranks, dp,
                               (long long)s->ranks, n, sup->workers, DTCTL_MAX_AGENTS);
        sup->nagents = (int)n;
    } else {
        sup->nagents = 2;
    }
    if (o->agents > 0 || o->workers > 0 || s->ranks <= 0) {
        /* the slots make the rings: dp of them, of equal size */
        while (o->agents <= 0 && ((long long)sup->nagents * sup->workers) % dp != 0 &&
               sup->nagents < DTCTL_MAX_AGENTS)
            sup->nagents++;
        if (((long long)sup->nagents * sup->workers) % dp != 0)
            return dt_emsg_set(em, DT_EINVAL, "dp = %lld rings: %d agents of %d workers do not "
                               "split into %lld equal rings", dp, sup->nagents, sup->workers, dp);
        ranks = (long long)sup->nagents * sup->workers / dp;
    } else {
        ranks = s->ranks;
    }
    if (o->spares >= 0)
        sup->nspares = o->spares;
    else
        sup->nspares = (int)((s->spares + sup->workers - 1) / sup->workers);
    if (sup->workers > 64)
        return dt_emsg_set(em, DT_EINVAL, "%d workers per agent: at most 64", sup->workers);
    if (sup->nagents + sup->nspares > DTCTL_MAX_AGENTS)
        return dt_emsg_set(em, DT_EINVAL, "%d agents and %d spares: at most %d in all",
                           sup->nagents, sup->nspares, DTCTL_MAX_AGENTS);
    if ((rc = set_int(s, "ranks", ranks, em)) < 0 ||
        (rc = set_int(s, "gpus_per_node", sup->workers, em)) < 0 ||
        (rc = set_int(s, "nodes", sup->nagents + sup->nspares, em)) < 0)
        return rc;
    if ((s->spares > 0 || sup->nspares > 0) &&
        (rc = set_int(s, "spares", (long long)sup->nspares * sup->workers, em)) < 0)
        return rc;
    if ((rc = dt_spec_check(s, em)) < 0)
        return rc;
    return dt_hf_spec_fill(s, em);
}


/* Submit; the planner may refuse. Checkpoints go where the spec says, by
 * default into the coordinator's state directory (dtcoordd(8)). */
static int submit(dtctl_super_t *sup, const dt_spec_t *s, dt_emsg_t *em)
{
    json_t *res = NULL;
    char *text;
    int rc;

    text = dt_spec_format(s);
    dt_wire_submit_t req = { .spec = text };
    rc = dtctl_request(&sup->local, DT_MSG_SUBMIT, dt_wire_submit_encode(&req), &res, em);
    free(text);
    if (rc < 0)
        return rc;
    dt_wire_submit_ok_t ok;
    dt_emsg_t bad = { "" };
    sup->job = dt_wire_decode(dt_wire_schema(DT_MSG_SUBMIT, true), res, &ok, &bad) == 0 ? ok.id
                                                                                         : 0;
    json_decref(res);
    if (sup->job <= 0)
        return dt_emsg_set(em, DT_EPROTO, "the coordinator's reply to SUBMIT has no job id");
    return 0;
}

/* ---- dtctl run ------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dtctl run --local [SPECFILE] [options]\n"
            "  --state-dir DIR      database, socket, logs (default $XDG_STATE_HOME/dt or\n"
            "                       ~/.local/state/dt)\n"
            "  --steps N            training steps (default: the spec's; built-in job 600)\n"
            "  --agents N           agents running ranks (default 2; enough for the\n"
            "                       spec's ranks, dp rings of them, when it has ranks)\n"
            "  --workers M          workers (ranks) per agent (default 2)\n"
            "  --spares K           spare agents of M slots, without ranks (default 0)\n"
            "  --inject-failure worker|hang|agent|coordinator[@STEP]\n"
            "                       one fault when a rank reaches STEP (default steps/2)\n"
            "  --hang-timeout DUR   agents' hang timeout (default theirs; 10s with hang)\n"
            "  --interval DUR       display refresh (default 500ms)\n"
            "  --device cpu|cuda    where the ranks compute (default: the spec's; the\n"
            "                       built-in job on cuda has 2 heads of 64)\n"
            "  --dtype bf16|fp16    the GPUs' compute dtype (default bf16)\n"
            "  --print-spec         print the job spec it would submit, and exit\n"
            "See dtctl(1).\n");
}

static int parse_count(const char *opt, const char *v, int min, int *out)
{
    int64_t n;
    if (dt_conf_parse_int(v, min, DTCTL_MAX_AGENTS, &n) < 0) {
        fprintf(stderr, "dtctl run: %s '%s': an integer from %d to %d\n", opt, v, min,
                DTCTL_MAX_AGENTS);
        return DTCTL_USAGE;
    }
    *out = (int)n;
    return 0;
}

static int parse_opts(int argc, char **argv, opts_t *o)
{
    static const struct option lo[] = {
        { "local", no_argument, NULL, 'L' },
        { "state-dir", required_argument, NULL, 'd' },
        { "steps", required_argument, NULL, 's' },
        { "agents", required_argument, NULL, 'a' },
        { "workers", required_argument, NULL, 'w' },
        { "spares", required_argument, NULL, 'k' },
        { "inject-failure", required_argument, NULL, 'f' },
        { "hang-timeout", required_argument, NULL, 'H' },
        { "interval", required_argument, NULL, 'i' },
        { "json", no_argument, NULL, 'j' },
        { "print-spec", no_argument, NULL, 'P' },
        { "device", required_argument, NULL, 'D' },
        { "dtype", required_argument, NULL, 'T' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c, rc = 0;

    *o = (opts_t){ .agents = -1, .workers = -1, .spares = -1, .interval_ms = 500 };
    opterr = 0;
    while (rc == 0 && (c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'L': o->local = 1; break;
        case 'd': o->state_dir = optarg; break;
        case 's': o->steps = optarg; break;
        case 'a': rc = parse_count("--agents", optarg, 1, &o->agents); break;
        case 'w': rc = parse_count("--workers", optarg, 1, &o->workers); break;
        case 'k': rc = parse_count("--spares", optarg, 0, &o->spares); break;
        case 'f': o->inject = optarg; break;
        case 'H':
        case 'i': {
            int64_t *dst = c == 'H' ? &o->hang_ms : &o->interval_ms;
            if (dt_conf_parse_duration(optarg, dst) < 0 || *dst < 10 || *dst > 3600000) {
                fprintf(stderr, "dtctl run: %s '%s': a duration from 10ms to 1h, such as 500ms "
                        "or 10s\n", c == 'H' ? "--hang-timeout" : "--interval", optarg);
                rc = DTCTL_USAGE;
            }
            break;
        }
        case 'j': o->json = 1; break;
        case 'P': o->print_spec = 1; break;
        case 'D': o->device = optarg; break;
        case 'T': o->dtype = optarg; break;
        case 'h': usage(stdout); return -1;
        default:
            fprintf(stderr, "dtctl run: unknown option or missing value '%s'\n",
                    argv[optind - 1]);
            usage(stderr);
            return DTCTL_USAGE;
        }
    }
    if (rc)
        return rc;
    if (optind < argc)
        o->spec_file = argv[optind++];
    if (optind < argc) {
        fprintf(stderr, "dtctl run: unexpected argument '%s' (one SPECFILE at most)\n",
                argv[optind]);
        return DTCTL_USAGE;
    }
    if (!o->local) {
        fprintf(stderr, "dtctl run: only --local is supported (a private coordinator and "
                        "agents on this machine); on a cluster use dtctl submit\n");
        usage(stderr);
        return DTCTL_USAGE;
    }
    return 0;
}

/* The run: the spec checked and the fault parsed before anything starts,
 * then the supervisor's coordinator, the job, its agents and the watch,
 * and on every way out the supervisor's teardown. */
int dtctl_run(dtctl_t *ctl, int argc, char **argv)
{
    dtctl_super_t sup = { .ctl = ctl };
    dtctl_inject_t inj = { .kind = DTCTL_INJ_NONE };
    dt_spec_t spec = { 0 };
    dt_emsg_t em = { "" };
    dtctl_watch_hooks_t hooks = { .poll = dtctl_super_poll, .arg = &sup, .gap_s = 60 };
    opts_t o;
    int rc, code, sig;

    /* options, spec, fault: every mistake is found before anything starts */
    if ((rc = parse_opts(argc, argv, &o)) != 0)
        return rc < 0 ? DTCTL_OK : rc;
    if (o.json)
        ctl->json = 1;
    sup.out = ctl->json ? stderr : stdout;
    sup.local = (dtctl_t){ .prog = ctl->prog, .json = ctl->json };
    sup.hang_ms = o.hang_ms;
    if (make_spec(&sup, &o, &spec, &em) < 0 ||
        (o.inject && dtctl_inject_parse(&inj, o.inject, job_steps(&spec), &em) < 0)) {
        fprintf(stderr, "dtctl run: %s\n", em.s);
        dt_spec_free(&spec);
        return DTCTL_USAGE;
    }
    if (o.print_spec) {
        char *text = dt_spec_format(&spec);
        fputs(text, stdout);
        free(text);
        dt_spec_free(&spec);
        return DTCTL_OK;
    }
    if (inj.kind == DTCTL_INJ_HANG && sup.hang_ms == 0)
        sup.hang_ms = 10000; /* the agents' default (60 s) is a long wait */
    /* the injector acts through the supervisor; the supervisor shows it
     * every SHOW reply */
    inj.hooks = (dtctl_inject_hooks_t){ .kill_worker = dtctl_super_kill_worker,
                                        .kill_agent = dtctl_super_kill_agent,
                                        .kill_coord = dtctl_super_kill_coord,
                                        .arg = &sup };
    if (inj.kind != DTCTL_INJ_NONE) {
        sup.on_show = dtctl_inject_on_show;
        sup.on_show_arg = &inj;
    }
    if (dtctl_super_find_programs(&sup, &em) < 0 ||
        dtctl_super_state_dir(&sup, o.state_dir, &em) < 0) {
        fprintf(stderr, "dtctl run: %s\n", em.s);
        code = DTCTL_ERROR;
        goto out;
    }

    /* from here on every way out goes through teardown */
    dtctl_super_signals_install();
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    fprintf(sup.out, "state directory %s\n", sup.dir);
    if ((rc = dtctl_super_coord_start(&sup, &em)) < 0) {
        fprintf(stderr, "dtctl run: %s\n", em.s);
        if (rc != DT_ECANCELED)
            dtctl_super_log_tail(sup.coord.log, 5);
        code = rc == DT_ECANCELED ? 128 + dtctl_super_signal() : DTCTL_NOCOORD;
        goto stop;
    }
    fprintf(sup.out, "dtcoordd pid %ld, socket %s\n", (long)sup.coord.pid, sup.sock);
    if ((rc = submit(&sup, &spec, &em)) < 0) {
        code = dtctl_fail(&sup.local, "run", rc, &em);
        goto stop;
    }
    if (spec.dp > 1)
        fprintf(sup.out, "job %lld submitted: %lld ranks (dp = %lld rings of %lld) on %d agent%s "
                "of %d workers, %d spare%s\n", sup.job, (long long)(spec.dp * spec.ranks),
                (long long)spec.dp, (long long)spec.ranks, sup.nagents,
                sup.nagents == 1 ? "" : "s", sup.workers, sup.nspares,
                sup.nspares == 1 ? "" : "s");
    else
        fprintf(sup.out, "job %lld submitted: %lld ranks on %d agent%s of %d workers, %d "
                "spare%s\n", sup.job, (long long)spec.ranks, sup.nagents,
                sup.nagents == 1 ? "" : "s", sup.workers, sup.nspares,
                sup.nspares == 1 ? "" : "s");
    rc = dtctl_super_agents_start(&sup, 0, sup.nagents, &em);
    if (rc == 0 && sup.nspares > 0) {
        /* the coordinator places ranks on the agents that are there, so
         * spares started after this are the ones left without ranks */
        dtctl_super_agents_registered(&sup, sup.nagents);
        rc = dtctl_super_agents_start(&sup, sup.nagents, sup.nagents + sup.nspares, &em);
    }
    if (rc < 0) {
        fprintf(stderr, "dtctl run: %s\n", em.s);
        code = DTCTL_ERROR;
        goto stop;
    }
    for (int i = 0; i < sup.nagents + sup.nspares; i++)
        fprintf(sup.out, "%s %s pid %ld, log %s\n", i < sup.nagents ? "agent" : "spare agent",
                sup.agents[i].name, (long)sup.agents[i].pid, sup.agents[i].log);
    if ((sig = dtctl_super_signal()) != 0) {
        code = 128 + sig;
        goto stop;
    }
    fflush(sup.out);

    /* the job, until it ends */
    code = dtctl_watch_job(&sup.local, "run", sup.job, o.interval_ms, &hooks);

stop:
    if ((sig = dtctl_super_signal()) != 0)
        fprintf(stderr, "%sdtctl run: %s: stopping (again to kill everything at once)\n",
                isatty(STDERR_FILENO) ? "\n" : "", strsignal(sig));
    dtctl_super_teardown(&sup, hooks.ended, dtctl_super_signal() ? "dtctl run interrupted"
                                                                 : "dtctl run stopped early");
    if (!hooks.ended && sup.job > 0 && !ctl->json)
        dtctl_print_result(stdout, sup.job, sup.state[0] ? sup.state : "unknown", NULL);
    /* on stderr: the result line stays the last of stdout, for scripts */
    fprintf(stderr, "state directory %s kept: database dt.db, logs dtcoordd.log and agents/\n",
            sup.dir);
out:
    dt_spec_free(&spec);
    dtctl_super_close(&sup);
    return code;
}
