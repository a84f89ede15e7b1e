/* SPDX-License-Identifier: MIT */
#ifndef DT_AGENT_H
#define DT_AGENT_H
#endif
