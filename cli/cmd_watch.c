/* SPDX-License-Identifier: MIT */
#include "config.h"
typedef int dt_stub_cmd_watch;
