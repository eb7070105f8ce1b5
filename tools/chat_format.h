/* chat_format.h — `moex generate --chat`: a user prompt in its model family's chat format. */
#ifndef MOEX_TOOLS_CHAT_FORMAT_H
#define MOEX_TOOLS_CHAT_FORMAT_H

#include <stddef.h>

/* text wrapped as one user turn and the opening of the assistant's, for the family model_type
 * (config.json's): a new string (free it), or NULL with *why saying which families have one. */
char *chat_wrap(const char *model_type, const char *text, const char **why);

/* config.json's model_type of checkpoint directory dir into out[n]; 0, or 1 after saying why on stderr. */
int chat_model_type(const char *dir, char *out, size_t n);

#endif
