() => {
    // Keyboard shortcuts help: Ctrl+/ anywhere, or ? outside a text field, opens a dialog that
    // lists every shortcut of the page (page.js and page_edges.js define them); Esc or its
    // button closes it, and the focus goes back where it was.
    const SHORTCUTS = [
        ["Enter", "Send the message"],
        ["Shift+Enter", "A new line in the message"],
        ["Esc", "Stop the reply being written (the message box keeps what you type)"],
        ["Ctrl+Shift+O", "A new chat"],
        ["Ctrl+K", "Search the chats"],
        ["Esc in the search box", "Clear the search"],
        ["↑ / ↓ in the chat list", "Move between chats"],
        ["Enter on a chat", "Open it"],
        ["Ctrl+/ or ?", "This list of shortcuts"],
    ];
    let dialog = null, before = null;
    const build = () => {
        dialog = document.createElement("dialog");
        dialog.id = "reame-shortcuts";
        dialog.setAttribute("aria-labelledby", "reame-shortcuts-title");
        const title = document.createElement("h2");
        title.id = "reame-shortcuts-title";
        title.textContent = "Keyboard shortcuts";
        const list = document.createElement("dl");
        for (const [keys, what] of SHORTCUTS) {
            const term = document.createElement("dt");
            for (const [n, key] of keys.split(" or ").entries()) {
                if (n) term.append(" or ");
                const kbd = document.createElement("kbd");
                kbd.textContent = key;
                term.append(kbd);
            }
            const description = document.createElement("dd");
            description.textContent = what;
            list.append(term, description);
        }
        const close = document.createElement("button");
        close.type = "button";
        close.textContent = "Close";
        close.addEventListener("click", () => dialog.close());
        dialog.append(title, list, close);
        dialog.addEventListener("close", () => before?.focus?.());
        document.body.append(dialog);
    };
    const typing = (target) => target.closest?.("textarea, input, [contenteditable=true]");
    document.addEventListener("keydown", (event) => {
        const asked = ((event.ctrlKey || event.metaKey) && event.key === "/")
            || (event.key === "?" && !event.ctrlKey && !event.metaKey && !typing(event.target));
        if (!asked || event.isComposing) return;
        event.preventDefault();
        if (!dialog) build();
        if (dialog.open) { dialog.close(); return; }
        before = document.activeElement;
        dialog.showModal();
    }, true);
}
